"""``GET /console``: the operator's web console, plain static files (no build step).

The page holds no data: its script reads everything through the API methods
(getInstanceGroupUsage, listInstanceInfo, listStorage, checkHealth, getMetrics,
getCapacityReport), with an admin account's bearer when the service has auth on (it asks
for one when a call answers 401/403). So the files are served to anyone, like ``/docs``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from chalice import Blueprint, NotFoundError, Response

from .openapi import PlainRoute

blueprint = Blueprint(__name__)

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"
ASSETS = {"console.js": "application/javascript", "console.css": "text/css"}
HTML = "text/html"
ROUTES = [
    PlainRoute("/console", "The operator console (its data comes from the API methods)", (HTML,)),
    PlainRoute(
        "/console/{asset}",
        "The console's script and style sheet",
        tuple(dict.fromkeys(ASSETS.values())),
        assets=tuple(ASSETS),
    ),
]


@functools.cache
def _file(name: str) -> str:
    return (CONSOLE_DIR / name).read_text(encoding="utf-8")


def _text(body: str, content_type: str) -> Response:
    # no-cache: a deployment's new console is picked up at the next load.
    return Response(
        body=body,
        status_code=200,
        headers={"Content-Type": f"{content_type}; charset=utf-8", "Cache-Control": "no-cache"},
    )


@blueprint.route("/console", methods=["GET"])
def console() -> Response:
    return _text(_file("index.html"), HTML)


@blueprint.route("/console/{asset}", methods=["GET"])
def console_asset(asset: str) -> Response:
    if asset not in ASSETS:
        raise NotFoundError(asset)
    return _text(_file(asset), ASSETS[asset])
