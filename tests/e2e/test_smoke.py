"""Smoke tests over HTTP and Step Functions against the running local stack."""
from __future__ import annotations

import json

from chalicelib.local import LocalStack

from .harness import ECHO_WORKFLOW, Api, run_execution


def test_check_health_answers(api: Api):
    status, body = api.call("checkHealth", {})
    assert status == 200, body
    assert body["header"]["status"]["code"] == "OK"


def test_non_json_body_is_400_with_empty_object(api: Api):
    assert api.call("checkHealth", b"not json") == (400, {})


def test_unknown_method_is_refused_as_json(api: Api):
    status, body = api.call("noSuchMethod", {})
    # API Gateway (and Chalice's local gateway) answer an unknown path with 403 JSON.
    assert status == 403 and "message" in body


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
