"""Write-session reaper and batched deletion, executed as the real ASL in moto."""

import json
from pathlib import Path

import pytest

from chalicelib.cache.deletion import DeletionService
from chalicelib.index.types import MODE_PREFIX, MODE_RAW
from chalicelib.protocol.models import BlockMask, FinishWriteCacheRequest, StartWriteCacheRequest

from .harness import wait_execution, wait_for

pytestmark = pytest.mark.slow  # every test waits for a state machine run on the wall clock


def _write_files(start) -> list[Path]:
    paths = []
    for loc in start.locations:
        for spec in loc["location_specs"]:
            path = Path(spec["uri"].split("?")[0][len("file://nfs_01") :])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 2048)
            paths.append(path)
    return paths


def _statuses(runtime, keys):
    ctx = runtime.contexts("i1")
    return [r is not None for r in runtime.index.read_raw(ctx.layout, keys, MODE_RAW)]


def test_abandoned_session_is_reaped_with_its_data(stack):
    rt = stack.runtime
    start = rt.cache.start_write_cache(
        StartWriteCacheRequest(instance_id="i1", block_keys=[1, 2, 3], write_timeout_seconds=1)
    )
    files = _write_files(start)
    deadline = rt.clock.now() + 1
    execution = stack.sfn.start_execution(
        stateMachineArn=stack.machines["write_session_reaper"],
        name="reaper-t1",
        input=json.dumps({"interval_s": 1, "max_rounds": 30}),
    )
    gone = wait_for(lambda: not any(_statuses(rt, [1, 2, 3])) and not any(p.exists() for p in files), 12)
    assert gone, "abandoned session not reaped"
    assert rt.clock.now() <= deadline + 5 + 1, "reaped later than the 5 s slack"
    late = {"instance_id": "i1", "write_session_id": start.write_session_id, "success_blocks": {"offset": 3}}
    import pytest

    from chalicelib.index.errors import WriteSessionError

    with pytest.raises(WriteSessionError):
        rt.cache.finish_write_cache(FinishWriteCacheRequest.model_validate(late))
    assert rt.index.usage([rt.contexts("i1").layout])[0].bytes == 0
    stack.sfn.stop_execution(executionArn=execution["executionArn"])


def test_reaper_continues_as_a_new_execution(stack):
    arn = stack.sfn.start_execution(
        stateMachineArn=stack.machines["write_session_reaper"],
        name="reaper-short",
        input=json.dumps({"interval_s": 0, "max_rounds": 2}),
    )["executionArn"]
    assert wait_execution(stack.sfn, arn)["status"] == "SUCCEEDED"
    executions = stack.sfn.list_executions(stateMachineArn=stack.machines["write_session_reaper"])["executions"]
    assert len(executions) >= 2, "the finished execution did not start its successor"
    assert set(stack.runtime.session_reaper.reaper_watchdog()) == {"running"}, "watchdog started a second reaper"


def test_failing_batch_retries_then_completes(stack, monkeypatch):
    rt = stack.runtime
    start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="i1", block_keys=[1, 2]))
    files = _write_files(start)
    rt.cache.finish_write_cache(
        FinishWriteCacheRequest(
            instance_id="i1", write_session_id=start.write_session_id, success_blocks=BlockMask(offset=2)
        )
    )
    backend = rt.contexts("i1").storages[0].backend
    calls = []
    original = backend.delete_groups

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise OSError("storage hiccup")
        return original(*args, **kwargs)

    monkeypatch.setattr(backend, "delete_groups", flaky)
    from chalicelib.protocol.models import RemoveCacheRequest

    rt.cache.remove_cache(RemoveCacheRequest(instance_id="i1", block_keys=[1, 2]))
    assert _statuses(rt, [1, 2]) == [True, True]  # DELETING: still recorded, no longer served
    assert rt.index.read_raw(rt.contexts("i1").layout, [1, 2], MODE_PREFIX) == []
    executions = stack.sfn.list_executions(stateMachineArn=stack.machines["batched_delete"])["executions"]
    assert len(executions) == 1
    result = wait_execution(stack.sfn, executions[0]["executionArn"])
    assert result["status"] == "SUCCEEDED"
    assert len(calls) == 2
    assert not any(p.exists() for p in files)
    assert _statuses(rt, [1, 2]) == [False, False]
    history = stack.sfn.get_execution_history(executionArn=executions[0]["executionArn"])["events"]
    assert any(e["type"] == "TaskFailed" for e in history) or any("Fail" in e["type"] for e in history)


def test_rewritten_block_survives_a_replayed_batch(stack):
    rt = stack.runtime
    ctx = rt.contexts("i1")
    start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="i1", block_keys=[7]))
    rt.cache.finish_write_cache(
        FinishWriteCacheRequest(
            instance_id="i1", write_session_id=start.write_session_id, success_blocks=BlockMask(offset=1)
        )
    )
    victims = rt.index.mark_deleting(ctx.layout, [7], ctx.spec_layout.sizes)
    DeletionService(rt.index).delete(ctx, victims)
    again = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="i1", block_keys=[7]))
    files = _write_files(again)
    rt.cache.finish_write_cache(
        FinishWriteCacheRequest(
            instance_id="i1", write_session_id=again.write_session_id, success_blocks=BlockMask(offset=1)
        )
    )
    arn = stack.sfn.start_execution(
        stateMachineArn=stack.machines["batched_delete"],
        name="replay",
        input=json.dumps({"instance_id": "i1", "delay_s": 0, "batches": [[v.to_json() for v in victims]]}),
    )["executionArn"]
    assert wait_execution(stack.sfn, arn)["status"] == "SUCCEEDED"
    assert len(rt.index.read_raw(ctx.layout, [7], MODE_PREFIX)) == 1
    assert all(p.exists() for p in files)
