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


RST = re.compile(r"``|:[a-z]+:`|`_\b|^\.\. ", re.MULTILINE)


def test_every_operation_has_a_whole_summary_and_no_raw_rst(client):
    """Swagger UI shows each operation's summary beside its path: one there for every
    operation, not its id, not a docstring's first line cut mid-sentence, and Markdown
    (RST would show as typed) in summaries and descriptions."""
    doc = document(client)
    operations = [
        (f"{method.upper()} {path}", op) for path, entry in doc["paths"].items() for method, op in entry.items()
    ]
    assert len(operations) >= 52
    for where, op in operations:
        summary = op.get("summary", "")
        assert summary and summary != op["operationId"], where
        assert not RST.search(summary) and not RST.search(op.get("description", "")), where
        assert summary.count("`") % 2 == 0 and summary.count("(") == summary.count(")"), where
        if where.startswith("POST /api/"):
            assert summary[0].isupper() and summary.endswith("."), where  # a whole sentence
            assert len(summary) <= 120 and "\n" not in summary, where
