"""Smoke tests over HTTP and Step Functions against the running local stack."""

from __future__ import annotations

import json

from local_stack import LocalStack

from .harness import ECHO_WORKFLOW, Api, run_execution


def test_check_health_answers(api: Api):
    status, body = api.call("checkHealth", {})
    assert status == 200, body
    assert body["header"]["status"]["code"] == "OK"


def test_non_json_body_is_400_with_empty_object(api: Api):
    assert api.call("checkHealth", b"not json") == (400, {})


def test_unknown_method_is_404_with_an_empty_body_as_upstream(api: Api):
    # Not API Gateway's 403 "Missing Authentication Token" (routes/unknown.py).
    assert api.call("noSuchMethod", {}) == (404, None)
    assert api.call("getcachelocation", {}) == (404, None)


def test_one_access_line_per_request(stack: LocalStack, api: Api, capsys, caplog):
    """The app's JSON line for /api/ calls (caplog), the dev server's line for the rest (stderr)."""
    import logging
    import urllib.request

    capsys.readouterr()
    with caplog.at_level(logging.INFO, logger="kvcm"):
        api.call("checkHealth", {"trace_id": "one-line"})
        api.call("noSuchMethod", {})
        urllib.request.urlopen(f"{stack.api_url}/openapi.json", timeout=10).read()
    server_lines = capsys.readouterr().err.splitlines()
    app_lines = [(r.api, r.code) for r in caplog.records if r.getMessage() == "access"]
    assert app_lines == [("checkHealth", "OK"), ("noSuchMethod", "NOT_FOUND")]
    assert [line.split('"')[1] for line in server_lines if " - - [" in line] == ["GET /openapi.json HTTP/1.1"]


def test_state_machine_task_runs_the_handler(stack: LocalStack):
    execution = run_execution(stack, ECHO_WORKFLOW, {"n": 1})
    assert execution["status"] == "SUCCEEDED", execution
    assert json.loads(execution["output"]) == {"echo": {"n": 1}, "function": ECHO_WORKFLOW}


def test_handler_error_is_a_catchable_task_error(stack: LocalStack):
    execution = run_execution(stack, ECHO_WORKFLOW, {"fail": True})
    assert execution["status"] == "SUCCEEDED", execution
    error = json.loads(execution["output"])["error"]
    assert error["Error"] == "ValueError"
    assert json.loads(error["Cause"])["errorMessage"] == "asked to fail"


def test_seeded_configuration_is_served_by_the_control_plane(stack: LocalStack):
    from chalicelib.runtime import get_runtime

    control = get_runtime().control
    storage = control.get_storage("nfs_01")
    assert storage.config.nfs.root_path == str((stack.config.data_dir / "nfs_01").resolve())
    assert control.get_group("default").storage_candidates == ["nfs_01"]
