"""The local stack as a whole: restart on the same ports with state kept, clean shutdown,
cleanup after a failed start, and what it exports to the app's settings."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
import redis

from chalicelib.protocol.models import NfsStorageSpec, StorageConfig
from chalicelib.runtime import get_runtime
from local_stack import LocalStack
from local_stack.guard import PortInUseError
from local_stack.valkey import valkey_servers_in
from tests.e2e.harness import ECHO_WORKFLOW, FIXTURES, Api, e2e_stack, run_execution

pytestmark = pytest.mark.slow  # starts and stops whole local stacks (a Valkey process each): seconds

ECHO_ASL = FIXTURES / f"{ECHO_WORKFLOW}.asl.json"


def assert_closed(ports: dict[str, int]) -> None:
    for name, port in ports.items():
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"{name} port {port} still open"


def assert_no_new_threads(before: set[threading.Thread], grace_s: float = 2.0) -> None:
    deadline = time.monotonic() + grace_s
    while (
        left := [t for t in threading.enumerate() if t not in before and t.is_alive()]
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"threads left running: {[t.name for t in left]}"


def ports_of(stack: LocalStack) -> dict[str, int]:
    return {"api": stack.api.port, "aws": stack.aws.port, "valkey": stack.valkey.port}


def test_restart_on_the_same_ports_keeps_state_and_leaves_nothing_behind(tmp_path: Path):
    threads_before = set(threading.enumerate())
    first = e2e_stack(tmp_path / "state").start()
    try:
        ports = ports_of(first)
        assert run_execution(first, ECHO_WORKFLOW, {"n": 1})["status"] == "SUCCEEDED"
        redis.Redis.from_url(first.valkey_url).set("kvcm-test:restart", "kept")
        get_runtime().control.add_storage(
            StorageConfig(global_unique_name="nfs_02", nfs=NfsStorageSpec(root_path=str(tmp_path / "nfs_02")))
        )
    finally:
        first.stop()
    assert_closed(ports)
    assert_no_new_threads(threads_before)

    # The same ports again: they were released. The same state folder: data was kept.
    second = e2e_stack(
        tmp_path / "state", port=ports["api"], aws_port=ports["aws"], valkey_port=ports["valkey"]
    ).start()
    try:
        assert ports_of(second) == ports
        assert second.restored_items > 0
        assert get_runtime().control.get_storage("nfs_02").config.nfs.root_path == str(tmp_path / "nfs_02")
        assert redis.Redis.from_url(second.valkey_url).get("kvcm-test:restart") == b"kept"
        status, _ = Api(second.api_url).call("checkHealth", {})
        assert status in (200, 403)  # answered (403 until checkHealth is registered)
    finally:
        second.stop()
    assert_closed(ports)
    assert_no_new_threads(threads_before)


def test_state_machine_arns_reach_the_settings_and_are_withdrawn_at_stop(tmp_path: Path):
    workflows = tmp_path / "workflows"
    workflows.mkdir()
    (workflows / "write_session_reaper.asl.json").write_text(ECHO_ASL.read_text())
    with e2e_stack(tmp_path / "state", workflow_dirs=(workflows,)) as stack:
        arn = stack.state_machines["write_session_reaper"]
        assert arn.endswith(":stateMachine:write_session_reaper")
        assert os.environ["KVCM_REAPER_STATE_MACHINE_ARN"] == arn
        assert get_runtime().settings.reaper_state_machine_arn == arn
    assert "KVCM_REAPER_STATE_MACHINE_ARN" not in os.environ


def test_a_workflow_without_its_function_is_skipped(tmp_path: Path):
    workflows = tmp_path / "workflows"
    workflows.mkdir()
    (workflows / "orphan.asl.json").write_text(
        '{"StartAt": "T", "States": {"T": {"Type": "Task", "Resource": "${NoSuchFunctionArn}", "End": true}}}'
    )
    with e2e_stack(tmp_path / "state", workflow_dirs=(workflows, ECHO_ASL.parent)) as stack:
        assert set(stack.state_machines) == {ECHO_WORKFLOW}
        assert "NoSuchFunctionArn" in stack.skipped_workflows["orphan"]
        assert "SKIPPED" in stack.banner()


def test_a_failed_start_stops_what_it_started(tmp_path: Path, monkeypatch):
    from moto.awslambda_simple.models import LambdaSimpleBackend

    original_invoke, environ = LambdaSimpleBackend.invoke, dict(os.environ)
    threads_before = set(threading.enumerate())
    # The API port is taken after the check (a race): the last step of start fails.
    monkeypatch.setattr("local_stack.stack.check_ports_free", lambda addresses: None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        stack = e2e_stack(tmp_path / "state", port=taken.getsockname()[1])
        with pytest.raises(PortInUseError, match="KVCM_PORT"):
            stack.start()
    assert LambdaSimpleBackend.invoke is original_invoke
    assert dict(os.environ) == environ
    assert_no_new_threads(threads_before)
    with pytest.raises(RuntimeError):
        _ = stack.valkey.url  # stopped
    assert (tmp_path / "state" / "control.json").exists()  # what was seeded got saved
    assert valkey_servers_in(tmp_path / "state" / "valkey") == []
    e2e_stack(tmp_path / "state").start().stop()  # the state lock was released
