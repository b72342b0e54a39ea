"""The Copy quarantine (docs/tiered-storage.md "Copy quarantine"), the real tier_copy ASL in
moto, real Valkey, moto S3: a CopyBytes that times out leaves its batch held (targets
WRITING, listed with the evidence, left alone by the reaper and the GC) until its writer's
hard timeout has passed (the injected clock) or an operator's break-glass release; the
group's quarantine limits refuse new begins."""

import json
import threading

import boto3
import pytest

from chalicelib.clock import ManualClock
from chalicelib.index import Status
from chalicelib.index.layout import CopyGuard
from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.protocol.models import BreakGlassReleaseAsyncCopyRequest
from chalicelib.workflows import migrations, quarantine

from .harness import wait_for
from .test_tier_copy import (
    BLOCK,
    ROUTE,
    _api,
    _completed,
    _copy,
    _counts,
    _exported,
    _group,
    _locations,
    _setup_tiers,
    _write,
)

pytestmark = pytest.mark.slow  # every test waits for a state machine run on the wall clock


@pytest.fixture
def workflow_clock():
    return ManualClock()


@pytest.fixture
def tiers(stack):
    """Instance t1 of group "tiers" (test_tier_copy's): a route copies nfs_01 to s3_01."""
    _setup_tiers(stack, _group("MIGRATION_RETENTION_KEEP_BOTH"))
    return stack


HELD = [("nfs_01", Status.SERVING), ("s3_01", Status.WRITING)]
RELEASE_AFTER_S = quarantine.COPY_WRITER_HARD_TIMEOUT_S + quarantine.QUARANTINE_MARGIN_S


def _lambda_timing_out(error_name):
    """A copy_blocks whose Lambda ends with error type ``error_name`` (its class's name), as
    Lambda reports a function it stopped at its own timeout (``Sandbox.Timedout``)."""
    timed_out = type(error_name, (Exception,), {})

    def copy(*args, **kwargs):
        raise timed_out("Task timed out after 300.00 seconds")

    return copy


def _state_timing_out(monkeypatch):
    """Every CopyBytes attempt outlives its state: the copy runs (and writes its bytes) but
    Step Functions has stopped waiting, and moto's interpreter reports States.Timeout (its
    TimeoutSeconds path) while the writer goes on."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    invoke = lambda_eval_utils.execute_lambda_function_integration

    def timing_out(env, parameters, region, state_credentials):
        invoke(env=env, parameters=parameters, region=region, state_credentials=state_credentials)
        if str(parameters.get("FunctionName", "")).endswith(":copy_bytes"):
            env.stack.pop()
            raise TimeoutError("the state's TimeoutSeconds passed")

    monkeypatch.setattr(lambda_eval_utils, "execute_lambda_function_integration", timing_out)


def _quarantined_copy(stack, monkeypatch, keys, state_timeout=False):
    """Copy ``keys`` with every CopyBytes attempt timing out: (the execution's ARN, the
    batch's result)."""
    if state_timeout:
        _state_timing_out(monkeypatch)
    else:
        monkeypatch.setattr(migrations, "copy_blocks", _lambda_timing_out("Sandbox.Timedout"))
    done = _copy(stack, keys)
    assert done["status"] == "SUCCEEDED", done
    (result,) = json.loads(done["output"])["results"]
    return done["executionArn"], result


def _s3_objects():
    return boto3.client("s3").list_objects_v2(Bucket="cold").get("Contents", [])


def _records(group=""):
    answer = _api("listAsyncCopyQuarantine", {"instance_group_name": group})
    assert answer["header"]["status"]["code"] == "OK", answer
    return answer["records"]


def _break_glass(body):
    return _api("breakGlassReleaseAsyncCopy", body)["header"]["status"]


def _evidence(operation_id, overrides=None):
    return {
        "trace_id": "incident-7",
        "operation_id": operation_id,
        "operator_name": "alice",
        "external_fencing_evidence": "lambda kvcm-copy_bytes concurrency set to 0 at 10:02",
        "external_fencing_confirmed": True,
    } | (overrides or {})


def _released(rt, keys, before):
    """The targets failed and deleted: only the sources left, the counters as before."""
    ctx = rt.contexts("t1")
    assert wait_for(lambda: _locations(rt, keys) == [[("nfs_01", Status.SERVING)]] * len(keys), 20)
    assert wait_for(lambda: _counts(rt.index.usage([ctx.layout])[0]) == _counts(before), 5)
    assert _records() == []


def test_a_copy_that_times_out_is_held_listed_and_released_after_the_writers_hard_timeout(tiers, monkeypatch):
    rt = tiers.runtime
    _write(rt, [1, 2, 3])
    ctx = rt.contexts("t1")
    before = rt.index.usage([ctx.layout])[0]
    begun_us = int(rt.clock.now() * 1e6)
    arn, result = _quarantined_copy(tiers, monkeypatch, [1, 2, 3], state_timeout=True)  # retried, then held
    assert result == {"batch": 0, "session_id": result["session_id"], "quarantined": 3}
    operation_id = result["session_id"]
    # Held: not served, still counted (the S3 bytes of three blocks), nothing deleted.
    assert _locations(rt, [1, 2, 3]) == [HELD] * 3
    held = rt.index.usage([ctx.layout])[0]
    assert held.by_type == before.by_type | {"ST_S3": 3 * BLOCK}
    records = _records()
    assert records == _records("tiers")
    assert [r["block_key"] for r in records] == ["1", "2", "3"]
    sources = {
        key: loc.location_id
        for key, record in zip([1, 2, 3], rt.index.read(ctx.layout, [1, 2, 3], 0), strict=True)
        for loc in record.locations
        if loc.status == Status.SERVING
    }
    for record in records:
        assert record | {"block_key": "", "target_location_id": "", "source_location_id": ""} == {
            "instance_group_name": "tiers",
            "instance_id": "t1",
            "block_key": "",
            "target_location_id": "",
            "guard_state": int(CopyGuard.QUARANTINED),
            "operation_id": operation_id,
            "source_location_id": "",
            "source_location_create_time": str(begun_us // 1000 * 1000),
            "source_storage_name": "nfs_01",
            "target_storage_name": "s3_01",
            "total_bytes": str(BLOCK),
            "backend_task_ids": [f"{arn}#0"],
            "create_time_us": str(begun_us),
            "update_time_us": str(begun_us),
            "last_error": records[0]["last_error"],
        }
        assert record["source_location_id"] == str(sources[int(record["block_key"])])
    assert records[0]["last_error"].startswith("States.Timeout")
    unknown = _api("listAsyncCopyQuarantine", {"instance_group_name": "nope"})["header"]["status"]
    assert unknown["code"] == "INVALID_ARGUMENT" and "instance_group_name" in unknown["message"]
    assert _exported("migration.quarantine") == {
        ("migration.quarantine_operations", (("instance_group", "tiers"),)): 1,
        ("migration.quarantine_bytes", (("instance_group", "tiers"),)): 3 * BLOCK,
    }
    # The reaper leaves it alone until the writer is certainly dead.
    rt.clock.advance(RELEASE_AFTER_S - 1)
    assert rt.session_reaper.expire_write_sessions() == {"expired": 0, "blocks": 0}
    assert _locations(rt, [1, 2, 3]) == [HELD] * 3
    # The GC too, however old the targets are (the reaper did not run meanwhile).
    rt.clock.advance(25 * 3600)
    report = rt.cache_gc.run()
    assert report["round_finished"] and report["candidates"]["orphan_writing"] == 0, report
    dropped = (("cause", "session_open"), ("reason", "orphan_writing"))
    assert _exported("cache_gc.candidate_dropped_count") == {("cache_gc.candidate_dropped_count", dropped): 3}
    assert _locations(rt, [1, 2, 3]) == [HELD] * 3
    assert _s3_objects(), "the writer outliving its state wrote the targets' bytes"
    # Then the reaper releases it: the targets fail and are deleted, not counted as expired.
    assert rt.session_reaper.expire_write_sessions() == {"expired": 0, "blocks": 0, "released": 1}
    _released(rt, [1, 2, 3], before)
    assert wait_for(lambda: not _s3_objects(), 20), "the late writer's objects were left behind"
    assert rt.session_reaper.expire_write_sessions() == {"expired": 0, "blocks": 0}
    assert _exported("migration.") == {
        ("migration.tasks_submitted_total", ROUTE): 3,
        _completed("quarantined"): 3,
        ("migration.quarantine_operations", (("instance_group", "tiers"),)): 0,
        ("migration.quarantine_bytes", (("instance_group", "tiers"),)): 0,
        (
            "migration.quarantine_released_total",
            (("instance_group", "tiers"), ("reason", "writer_timed_out")),
        ): 1,
    }


def test_the_quarantine_step_run_again_changes_nothing(tiers, monkeypatch):
    rt = tiers.runtime
    _write(rt, [1, 2])
    before = rt.index.usage([rt.contexts("t1").layout])[0]
    arn, result = _quarantined_copy(tiers, monkeypatch, [1, 2])
    first = _records()
    rt.clock.advance(10)
    event = {
        "instance_id": "t1",
        "source": "nfs_01",
        "target": "s3_01",
        "execution": arn.rsplit(":", 1)[1],
        "execution_id": arn,
        "batch": 0,
        "session_id": result["session_id"],
        "error": {"Error": "Sandbox.Timedout", "Cause": "again"},
    }
    assert rt.copy_tasks.hold(event) == result
    assert _records() == first  # the first hold's times, evidence and release time
    assert _exported("migration.tasks_completed_total") == {_completed("quarantined"): 2}
    rt.clock.advance(RELEASE_AFTER_S - 11)
    assert "released" not in rt.session_reaper.expire_write_sessions()
    rt.clock.advance(1)
    assert rt.session_reaper.expire_write_sessions()["released"] == 1
    _released(rt, [1, 2], before)  # no deletion left running into the next test


def test_break_glass_is_refused_without_every_piece_of_evidence_and_releases_once(tiers, monkeypatch):
    from chalice.test import Client

    from chalicelib.protocol.codes import Role
    from local_stack.stack import load_app
    from tests.integration.control.harness import enable_auth, post

    rt = tiers.runtime
    _write(rt, [1, 2])
    ctx = rt.contexts("t1")
    before = rt.index.usage([ctx.layout])[0]
    _, result = _quarantined_copy(tiers, monkeypatch, [1, 2])
    operation_id = result["session_id"]
    held = _records()
    refusals = [
        ({"operation_id": ""}, "operation_id"),
        ({"operator_name": ""}, "operator_name"),
        ({"operator_name": "  "}, "operator_name"),
        ({"external_fencing_evidence": ""}, "external_fencing_evidence"),
        ({"external_fencing_evidence": "x" * 201}, "external_fencing_evidence"),
        ({"external_fencing_confirmed": False}, "external_fencing_confirmed"),
        ({"operation_id": "copy-nope-0"}, "operation_id"),
        ({"guard_state": 1}, "guard_state"),  # the operation is QUARANTINED, not ACTIVE
        ({"guard_state": 7}, "guard_state"),
    ]
    for overrides, field in refusals:
        status = _break_glass(_evidence(operation_id, overrides))
        assert status["code"] == "INVALID_ARGUMENT" and f"'{field}'" in status["message"], (overrides, status)
        assert _records() == held and _locations(rt, [1, 2]) == [HELD] * 2, overrides
    rt.control.add_account("root", "adm1n-pass-word", Role.ROLE_ADMIN)
    enable_auth(rt)
    root = {"Authorization": "Bearer root:adm1n-pass-word"}
    with Client(load_app()) as client:
        status, answer = post(client, "breakGlassReleaseAsyncCopy", _evidence(operation_id), headers=root)
        assert status == 200 and answer["header"]["status"]["code"] == "OK", answer
        again = post(client, "breakGlassReleaseAsyncCopy", _evidence(operation_id), headers=root)[1]
        assert again["header"]["status"]["code"] == "INVALID_ARGUMENT"
        assert "'operation_id'" in again["header"]["status"]["message"]
        audit = post(client, "listAuditLog", {}, headers=root)[1]["records"]
    rt.reconfigure(auth_enabled=False)
    _released(rt, [1, 2], before)
    calls = [r for r in audit if r["api_name"] == "breakGlassReleaseAsyncCopy"]
    (release,) = [r for r in calls if "operator_name" in r["message"]]
    # The dispatcher's records of both calls name the operation too (the second refused).
    assert sorted(r["code"] for r in calls if r is not release) == ["INVALID_ARGUMENT", "OK"]
    assert all(f"operation_id={operation_id}" in r["target"] for r in calls)
    assert release["principal"] == "root" and release["code"] == "OK"
    assert f"operation_id={operation_id}" in release["target"] and "instance_id=t1" in release["target"]
    for word in ("'alice'", "concurrency set to 0", "'incident-7'"):
        assert word in release["message"], release
    assert _exported("migration.quarantine_released_total") == {
        ("migration.quarantine_released_total", (("instance_group", "tiers"), ("reason", "break_glass"))): 1
    }
    # The reaper finds nothing left to release.
    rt.clock.advance(RELEASE_AFTER_S)
    assert rt.session_reaper.expire_write_sessions() == {"expired": 0, "blocks": 0}


def test_break_glass_on_a_running_copy_is_refused_by_its_guard_state(tiers):
    """An operation id of a copy still running (its session open, ACTIVE) is released by no one."""
    rt = tiers.runtime
    _write(rt, [1])
    event = {"instance_id": "t1", "source": "nfs_01", "target": "s3_01", "execution": "copy-live", "batch": 0}
    event["retention"] = "MIGRATION_RETENTION_KEEP_BOTH"
    begun = rt.copy_tasks.begin(event | {"block_keys": [1]})
    listed = quarantine.QuarantinedOperation(begun["session_id"], "tiers", "t1", BLOCK, 1)
    rt.copy_quarantine.quarantine.add(listed)  # as a stale entry would list it
    status = _break_glass(_evidence(begun["session_id"]))
    assert status["code"] == "INVALID_ARGUMENT" and "ACTIVE" in status["message"], status
    assert _locations(rt, [1]) == [HELD]
    assert rt.copy_tasks.finish(begun | {"copied": False})["failed"] == 1  # its own finish still closes it
    assert wait_for(lambda: _locations(rt, [1]) == [[("nfs_01", Status.SERVING)]], 20)


def test_eight_racing_break_glass_releases_of_one_operation_make_exactly_one_release(tiers, monkeypatch):
    rt = tiers.runtime
    _write(rt, [1, 2, 3, 4])
    ctx = rt.contexts("t1")
    before = rt.index.usage([ctx.layout])[0]
    _, result = _quarantined_copy(tiers, monkeypatch, [1, 2, 3, 4])
    request = BreakGlassReleaseAsyncCopyRequest.model_validate(_evidence(result["session_id"]))
    barrier, outcomes = threading.Barrier(8), []

    def release():
        barrier.wait()
        try:
            rt.copy_quarantine_admin.break_glass_release_async_copy(request)
            outcomes.append("released")
        except InvalidArgumentError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=release) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes)[-1] == "released" and outcomes.count("released") == 1, outcomes
    assert all("'operation_id'" in o for o in outcomes if o != "released")
    _released(rt, [1, 2, 3, 4], before)
    assert _exported("migration.quarantine_released_total") == {
        ("migration.quarantine_released_total", (("instance_group", "tiers"), ("reason", "break_glass"))): 1
    }


@pytest.mark.parametrize(
    "limits",
    [{"copy_max_quarantine_operations": 1}, {"copy_max_quarantine_bytes": 2 * BLOCK}],
    ids=["operations", "bytes"],
)
def test_a_group_quarantine_at_its_limit_refuses_new_copies(stack, monkeypatch, limits):
    group = _group("MIGRATION_RETENTION_KEEP_BOTH")
    group.cache_config.migration_config = group.cache_config.migration_config.model_copy(update=limits)
    _setup_tiers(stack, group)
    rt = stack.runtime
    _write(rt, [1, 2, 3, 4])
    ctx = rt.contexts("t1")
    _quarantined_copy(stack, monkeypatch, [1, 2])  # two blocks held: one operation, 2 blocks of bytes
    before = rt.index.usage([ctx.layout])[0]
    monkeypatch.undo()  # copies work again
    done = _copy(stack, [3, 4])
    (refused,) = json.loads(done["output"])["results"]
    assert refused["refused"] == "QuarantineFullError" and "copy_max_quarantine" in refused["cause"], refused
    assert _locations(rt, [3, 4]) == [[("nfs_01", Status.SERVING)]] * 2  # nothing written
    assert _counts(rt.index.usage([ctx.layout])[0]) == _counts(before)
    assert _exported("migration.tasks_completed_total") == {_completed("quarantined"): 2, _completed("refused"): 2}
    # Released, the group copies again.
    rt.clock.advance(RELEASE_AFTER_S)
    assert rt.session_reaper.expire_write_sessions()["released"] == 1
    (served,) = json.loads(_copy(stack, [3, 4])["output"])["results"]
    assert (served["served"], served["failed"]) == (2, 0)


def test_a_sharded_instances_copy_is_held_in_every_shard_and_released_by_break_glass(stack, monkeypatch):
    from .test_sharded_tier_copy import SHARDS, _keys, _per_shard

    _setup_tiers(stack, _group("MIGRATION_RETENTION_KEEP_BOTH").model_copy(update={"instance_shards": SHARDS}))
    rt = stack.runtime
    keys = _keys(6)  # two blocks in each shard
    _write(rt, keys)
    before = _per_shard(rt)
    _, result = _quarantined_copy(stack, monkeypatch, keys)
    assert result["quarantined"] == len(keys)
    assert sorted(int(r["block_key"]) for r in _records()) == sorted(keys)
    assert _locations(rt, keys) == [HELD] * len(keys)
    assert all(now["by_type"]["ST_S3"] == 2 * BLOCK for now in _per_shard(rt))
    assert rt.session_reaper.expire_write_sessions() == {"expired": 0, "blocks": 0}  # a first, full sweep
    assert _break_glass(_evidence(result["session_id"]))["code"] == "OK"
    assert wait_for(lambda: _locations(rt, keys) == [[("nfs_01", Status.SERVING)]] * len(keys), 20)
    assert wait_for(lambda: _per_shard(rt) == before, 5)
    assert _records() == [] and _break_glass(_evidence(result["session_id"]))["code"] == "INVALID_ARGUMENT"


def test_a_copy_failing_after_an_attempt_that_may_have_timed_out_is_held_not_abandoned(tiers, monkeypatch):
    """The Catch sees the last attempt's error: a copy running for a step timeout or more may
    have had an earlier attempt time out, whose writer may still run."""
    rt = tiers.runtime
    _write(rt, [1, 2])

    def slow_then_broken(*args, **kwargs):
        rt.clock.advance(migrations.STEP_TIMEOUT_S["CopyBytes"])
        raise RuntimeError("the copy task crashed")

    monkeypatch.setattr(migrations, "copy_blocks", slow_then_broken)
    (result,) = json.loads(_copy(tiers, [1, 2])["output"])["results"]
    assert result == {"batch": 0, "session_id": result["session_id"], "quarantined": 2}
    assert _locations(rt, [1, 2]) == [HELD] * 2
    assert {r["last_error"].split(":")[0] for r in _records()} == {"RuntimeError"}
