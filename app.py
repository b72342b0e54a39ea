"""KVCM: wiring only. Routes live in chalicelib/routes; logic below them."""
from chalice import Chalice

from chalicelib.routes import admin, debug, meta

app = Chalice(app_name="kvcm")
app.register_blueprint(meta.blueprint)
app.register_blueprint(admin.blueprint)
app.register_blueprint(debug.blueprint)
