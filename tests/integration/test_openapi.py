"""GET /openapi.json and /docs: a valid OpenAPI 3.1 document naming every route of the app."""

import json
import re

from openapi_spec_validator import validate


def document(client) -> dict:
    response = client.http.get("/openapi.json")
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    return json.loads(response.body)


def test_the_document_is_valid_openapi_3_1(client):
    doc = document(client)
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_route_of_the_app_is_in_the_document(client):
    from app import app
    from chalicelib.routes import unknown

    paths = document(client)["paths"]
    # Every route but the answer to methods that do not exist.
    served = {(path, method.lower()) for path, entry in app.routes.items() for method in entry if path != unknown.PATH}
    documented = {(path, method) for path, entry in paths.items() for method in entry}
    assert served == documented


def test_bodies_come_from_the_handlers_models(client):
    doc = document(client)
    operation = doc["paths"]["/api/startWriteCache"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/StartWriteCacheRequest"
    }
    response = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert response == {"$ref": "#/components/schemas/StartWriteCacheResponse"}
    schemas = doc["components"]["schemas"]
    session = schemas["StartWriteCacheResponse"]["properties"]
    assert session["write_session_id"]["type"] == "string"
    assert session["locations"]["items"] == {"$ref": "#/components/schemas/CacheLocation"}
    # int64 is printed as a string and read as a number or a decimal string; enums by name
    # (or number, on the way in).
    timeout = schemas["StartWriteCacheRequest"]["properties"]["write_timeout_seconds"]
    assert {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1} in timeout["anyOf"]
    health = schemas["CheckHealthResponse"]["properties"]["elector_last_loop_time_ms"]
    assert health["type"] == "string" and re.fullmatch(health["pattern"], "-12")
    query_type = schemas["GetCacheLocationRequest"]["properties"]["query_type"]
    assert {"QT_PREFIX_MATCH", 2, "2"} <= set(query_type["enum"])
    code = schemas["Status"]["properties"]["code"]
    assert code["type"] == "string" and "SERVICE_NOT_READY" in code["enum"] and 4 not in code["enum"]


def test_docs_page_and_its_assets_are_served_without_a_cdn(client):
    page = client.http.get("/docs")
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    html = page.body.decode()
    assert "http" not in html  # every file from this service: browsers here reach no CDN
    for asset in re.findall(r'(?:src|href)="(docs/[^"]+)"', html):
        response = client.http.get(f"/{asset}")
        assert response.status_code == 200 and len(response.body) > 10_000, asset
    assert client.http.get("/docs/../app.py").status_code in (403, 404)
    assert client.http.get("/docs/index.html").status_code == 404
