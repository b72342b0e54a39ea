"""The deployed front door (issue 11.7): the API Gateway authorizer, and the debug
service that a deployed stage without auth refuses."""

import json
import os
import subprocess
import sys

import pytest

from chalicelib.protocol.codes import Role
from chalicelib.routes.gateway import GatewayUnauthorized, verdict
from tests.helpers import REPO_ROOT
from tests.integration.control.harness import code, post


def test_the_authorizer_allows_a_valid_key_and_names_its_principal(runtime):
    runtime.control.add_account("eng", "", Role.ROLE_ENGINE, groups=["g1"])
    api_key, record = runtime.control.create_api_key("eng", 3600)
    allowed = verdict(runtime, f"Bearer {api_key}")
    assert allowed.principal_id == f"eng/{record.key_id}" and allowed.routes == ["*"]
    assert allowed.context == {"role": "ROLE_USER"}
    for token in ("", "Bearer nope", f"Bearer {api_key[:-1]}x", "Basic abc"):
        with pytest.raises(GatewayUnauthorized, match="^Unauthorized$"):
            verdict(runtime, token)


def test_with_the_gateway_on_every_api_route_is_behind_it_and_no_handler_runs_unauthenticated():
    """A fresh interpreter loads the app as ``chalice package`` does for a stage that sets
    KVCM_GATEWAY_AUTHORIZER; its local gateway refuses a call without credentials."""
    script = """
import json
from chalice.test import Client
import app
# /api/{api_name} answers unknown methods 404 with no data: left open, as upstream's server.
routes = {(path, verb): entry.authorizer for path, methods in app.app.routes.items()
          if path.startswith("/api/") and path != "/api/{api_name}" for verb, entry in methods.items()}
names = sorted({a.name if a is not None else None for a in routes.values()})
with Client(app.app) as client:
    status = client.http.post("/api/getCacheLocation", body="{}").status_code
print(json.dumps({"routes": len(routes), "authorizers": names, "status": status}))
"""
    env = {
        **os.environ,
        "KVCM_GATEWAY_AUTHORIZER": "true",
        "KVCM_AUTH": "true",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    }  # a handler reaching AWS would fail loudly
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["routes"] > 30 and result["authorizers"] == ["kvcm_api_key"] and result["status"] == 401


def test_a_deployed_stage_without_auth_serves_no_fault_injection(runtime, client):
    runtime.reconfigure(stage="dev", debug_service=True, auth_enabled=False)
    status, data = post(client, "injectFault", {"api_name": "getCacheLocation"})
    assert (status, code(data)) == (200, "UNSUPPORTED") and "needs auth" in data["header"]["status"]["message"]
    runtime.reconfigure(stage="local")
    assert code(post(client, "injectFault", {"api_name": "getCacheLocation"})[1]) == "OK"
