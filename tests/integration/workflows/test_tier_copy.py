"""Tiered Copy as the real tier_copy ASL in moto (issue 24): NFS blocks copied to S3 (moto),
the bytes at the target URIs equal the source's, counters exact; retention; a copy that
fails for good or whose execution dies leaves nothing WRITING (the injected clock drives
the session's expiry)."""

import io
import json
import os
from pathlib import Path

import boto3
import pytest

from chalicelib.clock import ManualClock
from chalicelib.index import Status
from chalicelib.index.types import MODE_RAW
from chalicelib.observability.emf import EmfWriter
from chalicelib.protocol.codes import QueryType
from chalicelib.protocol.models import (
    BlockMask,
    FinishWriteCacheRequest,
    GetCacheLocationRequest,
    InstanceGroup,
    RegisterInstanceRequest,
    RemoveCacheRequest,
    StartWriteCacheRequest,
    StorageConfig,
)
from chalicelib.storage import BlockRef
from chalicelib.workflows import migrations, quarantine
from tests.helpers import SPECS

from .harness import wait_execution, wait_for

pytestmark = pytest.mark.slow  # every test waits for a state machine run on the wall clock

REPO = Path(__file__).resolve().parents[3]
BLOCK = sum(s["size"] for s in SPECS)


@pytest.fixture
def workflow_clock():
    return ManualClock()


def _group(retention: str) -> InstanceGroup:
    return InstanceGroup.model_validate(
        {
            "name": "tiers",
            "storage_candidates": ["nfs_01", "s3_01"],
            "quota": {"capacity": 1 << 30, "quota_config": [{"storage_type": "ST_S3", "capacity": 1 << 29}]},
            "cache_config": {
                "migration_config": {
                    "strategies": [
                        {
                            "source_storage_name": "nfs_01",
                            "target_storage_name": "s3_01",
                            "trigger_threshold": 0.8,
                            "method_configs": {"copy": {"enabled": True}},
                            "retention": retention,
                        }
                    ],
                    "copy_max_concurrency": 2,
                }
            },
        }
    )


def _setup_tiers(stack, group: InstanceGroup) -> None:
    """Bucket "cold" as storage s3_01, ``group`` (named "tiers") and its instance t1."""
    rt = stack.runtime
    boto3.client("s3").create_bucket(Bucket="cold")
    rt.control.add_storage(StorageConfig.model_validate({"global_unique_name": "s3_01", "s3": {"bucket": "cold"}}))
    rt.control.create_group(group)
    rt.meta_service.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": "tiers",
                "instance_id": "t1",
                "block_size": 4,
                "location_spec_infos": SPECS,
                "model_deployment": {"model_name": "m", "dtype": "fp16"},
            }
        )
    )


@pytest.fixture
def tiers(stack, request):
    """Instance t1 of group "tiers": blocks land on nfs_01, a route copies them to s3_01."""
    retention = getattr(request, "param", "MIGRATION_RETENTION_KEEP_BOTH")
    _setup_tiers(stack, _group(retention))
    return stack


def _write(rt, keys):
    """Blocks written to nfs_01 (the bytes through the storage port, as an engine puts them
    at the URIs) and SERVING; their bytes per key."""
    start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="t1", block_keys=keys))
    assert all(loc["location_specs"][0]["uri"].startswith("file://nfs_01/") for loc in start.locations)
    ctx = rt.contexts("t1")
    blocks = [
        BlockRef("t1", key, loc.location_id, loc.group_id, loc.slot, ctx.spec_layout.slots(loc.spec_group))
        for key, record in zip(keys, rt.index.read(ctx.layout, keys, MODE_RAW), strict=True)
        for loc in record.locations
    ]
    data = [[os.urandom(spec.size) for spec in block.specs] for block in blocks]
    ctx.backend("nfs_01").write(blocks, data)
    rt.cache.finish_write_cache(
        FinishWriteCacheRequest(
            instance_id="t1", write_session_id=start.write_session_id, success_blocks=BlockMask(offset=len(keys))
        )
    )
    return dict(zip(keys, data, strict=True))


def _locations(rt, keys):
    ctx = rt.contexts("t1")
    names = rt.index.storage_names(ctx.layout)
    return [
        [(names[loc.storage_index], loc.status) for loc in record.locations] if record else []
        for record in rt.index.read(ctx.layout, keys, MODE_RAW)
    ]


def _s3_bytes(rt, key):
    """What an engine reads at the block's S3 URIs."""
    ctx = rt.contexts("t1")
    record = rt.index.read(ctx.layout, [key], MODE_RAW)[0]
    s3_index = next(i for i, n in rt.index.storage_names(ctx.layout).items() if n == "s3_01")
    loc = next(loc for loc in record.locations if loc.storage_index == s3_index)
    backend = ctx.backend("s3_01")
    block = BlockRef("t1", key, loc.location_id, loc.group_id, loc.slot, ctx.spec_layout.slots(loc.spec_group))
    out = []
    for spec in block.specs:
        # s3://<storage name>/<object key>: the storage's bucket is "cold".
        object_key = backend.uri(block, spec).split("?")[0][len("s3://s3_01/") :]
        out.append(boto3.client("s3").get_object(Bucket="cold", Key=object_key)["Body"].read())
    return out


def _copy(stack, keys):
    """Copy along the group's route, with its retention."""
    rt = stack.runtime
    ctx = rt.contexts("t1")
    (route,) = ctx.group.cache_config.migration_config.strategies
    arn = rt.tier_copies.submit(ctx, "nfs_01", "s3_01", keys, route.retention)
    return wait_execution(stack.sfn, arn, timeout_s=60)


#: The tags of the migration.* series of the route nfs_01 → s3_01 of group "tiers".
ROUTE = (("instance_group", "tiers"), ("source_storage", "nfs_01"), ("target_storage", "s3_01"))


def _api(method, body=None):
    """One wire call to the app (the stack's runtime), its answer."""
    from chalice.test import Client

    from local_stack.stack import load_app
    from tests.integration.control.harness import call

    with Client(load_app()) as client:
        return call(client, method, body or {})


def _exported(prefix):
    """The service's metrics named ``prefix``..., as getMetrics answers them: {(name, tags): value}."""
    out = {}
    for point in _api("getMetrics")["metrics"]:
        if point["metric_name"].startswith(prefix):
            value = point["metric_value"]
            tags = tuple(sorted((t["tag_key"], t["tag_value"]) for t in point.get("metric_tags", [])))
            out[(point["metric_name"], tags)] = float(value.get("int_value", value.get("float_value", 0)))
    return out


def _completed(status):
    return ("migration.tasks_completed_total", tuple(sorted((*ROUTE, ("status", status)))))


def test_nfs_blocks_are_copied_to_s3_and_serve_there_with_exact_counters(tiers):
    rt = tiers.runtime
    keys = list(range(1, 151))  # three batches (BATCH_SIZE 64), two at a time
    data = _write(rt, keys)
    ctx = rt.contexts("t1")
    before = rt.index.usage([ctx.layout])[0]
    done = _copy(tiers, keys)
    assert done["status"] == "SUCCEEDED"
    results = json.loads(done["output"])["results"]
    assert sum(r["served"] for r in results) == len(keys) and sum(r["failed"] for r in results) == 0
    assert all(locs == [("nfs_01", Status.SERVING), ("s3_01", Status.SERVING)] for locs in _locations(rt, keys))
    for key in (1, 64, 65, 150):
        assert _s3_bytes(rt, key) == data[key]
    usage = rt.index.usage([ctx.layout])[0]
    assert (usage.bytes, usage.keys) == (before.bytes + len(keys) * BLOCK, before.keys)
    assert usage.by_type == {"ST_NFS": len(keys) * BLOCK, "ST_S3": len(keys) * BLOCK}
    assert usage.deleting_bytes == 0
    group = rt.index.group_usage(["tiers"])[0]
    assert (group.bytes, group.keys) == (2 * len(keys) * BLOCK, len(keys))
    assert group.by_type == {"ST_NFS": len(keys) * BLOCK, "ST_S3": len(keys) * BLOCK}
    exported = _exported("migration.")
    assert {k: v for k, v in exported.items() if k[0] != "migration.copy_duration_ms"} == {
        ("migration.tasks_submitted_total", ROUTE): len(keys),
        _completed("success"): len(keys),
        ("migration.copy_bytes_total", ROUTE): len(keys) * BLOCK,
    }
    assert ("migration.copy_duration_ms", ROUTE) in exported  # its value: test_every_step_run_again_does_the_same
    # Run again: every target is held already, nothing moves.
    again = json.loads(_copy(tiers, keys)["output"])["results"]
    assert sum(r["served"] for r in again) == 0
    assert rt.index.usage([ctx.layout])[0] == usage
    assert _exported("migration.") == exported


def test_the_group_usage_and_metrics_show_each_tier(tiers):
    """getInstanceGroupUsage and getMetrics (the usage_metrics schedule's gauges) per storage
    and per storage type, over the wire, once a copy put a block on each tier."""
    rt = tiers.runtime
    _write(rt, [1, 2, 3])
    assert _copy(tiers, [1, 2])["status"] == "SUCCEEDED"
    (usage,) = _api("getInstanceGroupUsage", {"instance_group_name": "tiers"})["usage"]
    assert usage["by_storage"] == [
        {"storage_name": "nfs_01", "storage_type": "ST_NFS", "used_bytes": str(3 * BLOCK)},
        {"storage_name": "s3_01", "storage_type": "ST_S3", "used_bytes": str(2 * BLOCK)},
    ]
    assert [(t["storage_type"], int(t["used_bytes"]), int(t["capacity"])) for t in usage["by_storage_type"]] == [
        ("ST_NFS", 3 * BLOCK, 0),
        ("ST_S3", 2 * BLOCK, 1 << 29),
    ]
    rt.usage_metrics.run()
    group = (("instance_group", "tiers"),)
    exported = _exported("cache_manager_group.storage")
    assert {k: v for k, v in exported.items() if k[1][0] == group[0]} == {
        ("cache_manager_group.storage_byte_size", (*group, ("storage", "nfs_01"))): 3 * BLOCK,
        ("cache_manager_group.storage_byte_size", (*group, ("storage", "s3_01"))): 2 * BLOCK,
        ("cache_manager_group.storage_type_byte_size", (*group, ("storage_type", "ST_NFS"))): 3 * BLOCK,
        ("cache_manager_group.storage_type_byte_size", (*group, ("storage_type", "ST_S3"))): 2 * BLOCK,
        ("cache_manager_group.storage_type_usage_ratio", (*group, ("storage_type", "ST_S3"))): 2 * BLOCK / (1 << 29),
    }


@pytest.mark.parametrize("tiers", ["MIGRATION_RETENTION_DELETE_SOURCE"], indirect=True)
def test_delete_source_hands_the_sources_to_batched_deletion_once_the_targets_serve(tiers):
    rt = tiers.runtime
    keys = list(range(1, 8))  # packed two to a file: the last file holds one block
    data = _write(rt, keys)
    ctx = rt.contexts("t1")
    nfs = ctx.backend("nfs_01")
    files = [p for p in Path(nfs.data_root).rglob("*") if p.is_file()]
    assert len(files) == 2 * 4  # two specs, four files each
    done = _copy(tiers, keys)
    assert done["status"] == "SUCCEEDED"
    (result,) = json.loads(done["output"])["results"]
    assert (result["served"], result["sources_deleted"]) == (len(keys), len(keys))
    # The sources' deletion is a batched_delete execution: wait for it to drop them.
    assert wait_for(lambda: _locations(rt, keys) == [[("s3_01", Status.SERVING)]] * len(keys), 20)
    # The deleter drops the records first and then the packed files their last block left
    # (cache/deletion.py): the files go a moment after the locations.
    assert wait_for(lambda: not any(p.exists() for p in files), 20), "the source files were not deleted"
    assert all(_s3_bytes(rt, key) == data[key] for key in keys)
    usage = _counts(rt.index.usage([ctx.layout])[0])
    assert (usage["bytes"], usage["keys"], usage["deleting_bytes"]) == (len(keys) * BLOCK, len(keys), 0)
    assert usage["by_type"] == {"ST_S3": len(keys) * BLOCK}
    group = _counts(rt.index.group_usage(["tiers"])[0])
    assert (group["bytes"], group["keys"], group["by_type"]) == (
        len(keys) * BLOCK,
        len(keys),
        {"ST_S3": len(keys) * BLOCK},
    )
    read = rt.cache.get_cache_location(GetCacheLocationRequest(instance_id="t1", query_type=2, block_keys=keys))
    assert [loc["location_specs"][0]["uri"].startswith("s3://s3_01/") for loc in read.locations] == [True] * len(keys)


def test_a_copy_over_the_target_type_quota_is_refused_and_writes_nothing(tiers):
    rt = tiers.runtime
    _write(rt, [1, 2, 3])
    group = rt.control.get_group("tiers")
    group.quota.quota_config[0].capacity = 2 * BLOCK  # ST_S3 room for two blocks of three
    rt.control.update_group(group.model_copy(update={"version": 0}), group.version)
    rt.config.sync()
    ctx = rt.contexts("t1")
    before = (_locations(rt, [1, 2, 3]), _counts(rt.index.usage([ctx.layout])[0]))
    done = _copy(tiers, [1, 2, 3])
    assert done["status"] == "SUCCEEDED"
    (result,) = json.loads(done["output"])["results"]
    assert result["refused"] == "QuotaExceededError" and "quota" in result["cause"], result
    assert (_locations(rt, [1, 2, 3]), _counts(rt.index.usage([ctx.layout])[0])) == before
    assert _exported("migration.") == {("migration.tasks_submitted_total", ROUTE): 3, _completed("refused"): 3}


def test_a_transient_copy_failure_is_retried(tiers, monkeypatch):
    rt = tiers.runtime
    data = _write(rt, [1, 2])
    backend = rt.contexts("t1").backend("s3_01")
    original, calls = backend.write, []

    def flaky(blocks, payloads):
        calls.append(len(blocks))
        if len(calls) == 1:
            from chalicelib.storage import StorageError

            raise StorageError("s3_01: put failed (throttled)")
        return original(blocks, payloads)

    monkeypatch.setattr(type(backend), "write", lambda self, b, p: flaky(b, p))
    assert _copy(tiers, [1, 2])["status"] == "SUCCEEDED"
    assert len(calls) == 2
    assert _s3_bytes(rt, 2) == data[2]
    assert _locations(rt, [1, 2])[0][1] == ("s3_01", Status.SERVING)


def _counts(usage):
    """A usage's counters, those at 0 left out (a counter that went up and back stays, at 0)."""
    return {
        name: {k: v for k, v in value.items() if v} if isinstance(value, dict) else value
        for name, value in vars(usage).items()
    }


def _no_writing_left(rt, keys):
    return all(status != Status.WRITING for locs in _locations(rt, keys) for _, status in locs)


def test_a_copy_that_fails_for_good_deletes_its_targets(tiers, monkeypatch):
    rt = tiers.runtime
    _write(rt, [1, 2, 3])
    ctx = rt.contexts("t1")
    before = rt.index.usage([ctx.layout])[0]
    monkeypatch.setattr(migrations, "copy_blocks", _broken_copy)
    done = _copy(tiers, [1, 2, 3])
    assert done["status"] == "SUCCEEDED"
    assert json.loads(done["output"])["results"][0] | {"session_id": ""} == {
        "batch": 0,
        "session_id": "",
        "copied_bytes": 0,
        "served": 0,
        "failed": 3,
    }
    # The failed targets went to batched deletion: only the sources are left, counters back.
    assert wait_for(lambda: _locations(rt, [1, 2, 3]) == [[("nfs_01", Status.SERVING)]] * 3, 20)
    assert wait_for(lambda: _counts(rt.index.usage([ctx.layout])[0]) == _counts(before), 5)
    assert _counts(rt.index.group_usage(["tiers"])[0])["by_type"] == {"ST_NFS": 3 * BLOCK}
    assert _exported("migration.") == {("migration.tasks_submitted_total", ROUTE): 3, _completed("abandoned"): 3}


def _broken_copy(*args, **kwargs):
    raise RuntimeError("the copy task crashed")


def test_a_copy_whose_execution_dies_expires_and_nothing_stays_writing(tiers, monkeypatch):
    """The copy fails and so does its finish (the execution dies): the targets stay WRITING
    while the session lives, protected, and the reaper fails them once its deadline passes."""
    rt = tiers.runtime
    _write(rt, [1, 2])
    ctx = rt.contexts("t1")
    before = rt.index.usage([ctx.layout])[0]
    monkeypatch.setattr(migrations, "copy_blocks", _broken_copy)
    monkeypatch.setattr(migrations.CopyTasks, "finish", lambda self, event: _broken_copy())
    assert _copy(tiers, [1, 2])["status"] == "FAILED"
    assert [locs[1] for locs in _locations(rt, [1, 2])] == [("s3_01", Status.WRITING)] * 2
    emf = io.StringIO()
    monkeypatch.setattr(rt.session_reaper, "emf", EmfWriter("KVCM/test", rt.clock, emf))
    rt.clock.advance(migrations.COPY_SESSION_TTL_S - 1)
    assert rt.session_reaper.expire_write_sessions()["expired"] == 0, "a live copy's targets were failed"
    assert "ExpiredCopySessions" not in emf.getvalue()
    rt.clock.advance(2)
    assert rt.session_reaper.expire_write_sessions()["expired"] == 1
    assert _no_writing_left(rt, [1, 2])
    # What TierCopyStuckAlarm watches, and the service's own counter.
    (line,) = [json.loads(x) for x in emf.getvalue().splitlines() if "ExpiredCopySessions" in x]
    assert (line["ExpiredCopySessions"], line["Service"]) == (1, "kvcm")
    assert _exported("migration.copy_sessions_expired_total") == {
        ("migration.copy_sessions_expired_total", (("instance_group", "tiers"),)): 1
    }
    assert wait_for(lambda: _locations(rt, [1, 2]) == [[("nfs_01", Status.SERVING)]] * 2, 20)
    assert wait_for(lambda: _counts(rt.index.usage([ctx.layout])[0]) == _counts(before), 5)


def test_the_session_deadline_outlives_every_retry_of_the_asl():
    """The constants the session's deadline is computed from are the ASL's own."""
    definition = json.loads((REPO / "workflows" / "tier_copy.asl.json").read_text())
    states = definition["States"]["CopyBatches"]["ItemProcessor"]["States"]
    tasks = {name: s for name, s in states.items() if s["Type"] == "Task"}
    assert set(tasks) == {"BeginCopy", "CopyBytes", "FinishCopy", "AbandonCopy", "QuarantineCopy"}
    for state in tasks.values():
        function = state["Resource"][2 : -len("Arn}")]
        assert state["TimeoutSeconds"] == migrations.STEP_TIMEOUT_S[function]
        (retry,) = state["Retry"]
        assert (retry["MaxAttempts"], retry["IntervalSeconds"], retry["BackoffRate"]) == (
            migrations.RETRY_MAX_ATTEMPTS,
            migrations.RETRY_INTERVAL_S,
            migrations.RETRY_BACKOFF,
        )
    after_begin = migrations.step_budget_s(tasks["CopyBytes"]["TimeoutSeconds"]) + migrations.step_budget_s(
        tasks["FinishCopy"]["TimeoutSeconds"]
    )
    assert migrations.COPY_SESSION_TTL_S > after_begin
    # A whole execution: every batch one after the other, each at its longest.
    assert definition["TimeoutSeconds"] == migrations.EXECUTION_TIMEOUT_S
    batches = migrations.EXECUTION_SIZE // migrations.BATCH_SIZE
    longest_batch = migrations.step_budget_s(tasks["BeginCopy"]["TimeoutSeconds"]) + migrations.COPY_SESSION_TTL_S
    assert migrations.EXECUTION_TIMEOUT_S >= batches * longest_batch
    config = json.loads((REPO / ".chalice" / "config.json").read_text())["lambda_functions"]
    for name, timeout in (("copy_begin", 60), ("copy_bytes", 300), ("copy_finish", 60), ("copy_quarantine", 60)):
        assert config.get(name, {}).get("lambda_timeout", 60) == timeout
    # A quarantine is released once the copy's writer is dead: the copy function's hard timeout.
    assert quarantine.COPY_WRITER_HARD_TIMEOUT_S == config["copy_bytes"]["lambda_timeout"]
    assert quarantine.COPY_WRITER_HARD_TIMEOUT_S == tasks["CopyBytes"]["TimeoutSeconds"]
    to_quarantine, to_abandon = tasks["CopyBytes"]["Catch"]
    assert (tuple(to_quarantine["ErrorEquals"]), to_quarantine["Next"]) == (quarantine.TIMEOUT_ERRORS, "QuarantineCopy")
    assert (to_abandon["ErrorEquals"], to_abandon["Next"]) == (["States.ALL"], "AbandonCopy")


@pytest.mark.parametrize("tiers", ["MIGRATION_RETENTION_KEEP_BOTH"], indirect=True)
def test_admin_migrate_cache_starts_a_copy_that_deletes_the_source_and_is_audited(tiers):
    """Admin COPY always deletes the source (upstream), whatever the route's retention."""
    from chalice.test import Client

    from chalicelib.protocol.codes import Role
    from local_stack.stack import load_app
    from tests.integration.control.harness import enable_auth, post

    rt = tiers.runtime
    data = _write(rt, [1, 2, 3])
    rt.control.add_account("root", "adm1n-pass-word", Role.ROLE_ADMIN)
    enable_auth(rt)
    root = {"Authorization": "Bearer root:adm1n-pass-word"}
    body = {
        "instance_id": "t1",
        "method": "MIGRATION_METHOD_COPY",
        "source_storage_name": "nfs_01",
        "target_storage_name": "s3_01",
        "block_keys": ["1", 2, 3, 3, 99],
    }
    with Client(load_app()) as client:
        status, answer = post(client, "migrateCache", body, headers=root)
        assert status == 200 and answer["header"]["status"]["code"] == "OK", answer
        assert (answer["accepted"], answer["rejected"]) == ("3", "1")  # 99 was never written
        assert wait_execution(tiers.sfn, answer["execution_arn"], timeout_s=60)["status"] == "SUCCEEDED"
        assert wait_for(lambda: _locations(rt, [1, 2, 3]) == [[("s3_01", Status.SERVING)]] * 3, 20)
        assert all(_s3_bytes(rt, key) == data[key] for key in (1, 2, 3))
        audit = post(client, "listAuditLog", {}, headers=root)[1]
    (entry,) = [r for r in audit["records"] if r["api_name"] == "migrateCache"]
    assert entry["principal"] == "root" and "t1" in entry["target"] and entry["code"] == "OK", entry


@pytest.mark.parametrize("tiers", ["MIGRATION_RETENTION_DELETE_SOURCE"], indirect=True)
def test_every_step_run_again_does_the_same(tiers):
    """What the state machine's retries do after an attempt whose answer was lost."""
    rt = tiers.runtime
    _write(rt, [1, 2])
    tasks = rt.copy_tasks
    event = {
        "instance_id": "t1",
        "source": "nfs_01",
        "target": "s3_01",
        "retention": "MIGRATION_RETENTION_DELETE_SOURCE",
        "execution": "replayed",
        "batch": 0,
        "block_keys": [1, 2],
    }
    begun = tasks.begin(event)
    rt.clock.advance(1.5)
    assert tasks.begin(event) == begun and len(begun["blocks"]) == 2
    copied = tasks.copy(begun)
    assert tasks.copy(begun) == copied
    rt.clock.advance(1)
    first = tasks.finish(copied)
    assert (first["served"], first["sources_deleted"]) == (2, 2)
    again = tasks.finish(copied)
    assert (again["served"], again["failed"], again["sources_deleted"]) == (2, 0, 0)
    # Counted once, by the begin that made the session and the finish that closed it.
    assert _exported("migration.") == {
        ("migration.tasks_submitted_total", ROUTE): 2,
        _completed("success"): 2,
        ("migration.copy_bytes_total", ROUTE): 2 * BLOCK,
        ("migration.copy_duration_ms", ROUTE): 2500,
    }
    assert wait_for(lambda: _locations(rt, [1, 2]) == [[("s3_01", Status.SERVING)]] * 2, 20)


def test_a_target_whose_source_is_removed_during_the_copy_counts_as_failed(tiers):
    rt = tiers.runtime
    _write(rt, [1, 2])
    tasks = rt.copy_tasks
    event = {
        "instance_id": "t1",
        "source": "nfs_01",
        "target": "s3_01",
        "retention": "MIGRATION_RETENTION_KEEP_BOTH",
        "execution": "raced",
        "batch": 0,
        "block_keys": [1, 2],
    }
    copied = tasks.copy(tasks.begin(event))
    rt.cache.remove_cache(RemoveCacheRequest(instance_id="t1", block_keys=[1]))
    done = tasks.finish(copied)
    assert (done["served"], done["failed"]) == (1, 1)
    assert _exported("migration.") == {
        ("migration.tasks_submitted_total", ROUTE): 2,
        _completed("success"): 1,
        _completed("failed"): 1,
        ("migration.copy_bytes_total", ROUTE): BLOCK,
        ("migration.copy_duration_ms", ROUTE): 0,
    }


def _first_hand_over_fails(monkeypatch, deleter):
    """The deleter's first hand-over of victims fails (Step Functions refused StartExecution)."""
    from chalicelib.protocol.errors import ServiceNotReadyError

    original, failed = type(deleter).submit, []

    def refused_once(self, ctx, victims, delay_ms=0):
        if victims and not failed:
            failed.append(len(victims))
            raise ServiceNotReadyError("could not start delete-t1: ThrottlingException")
        return original(self, ctx, victims, delay_ms)

    monkeypatch.setattr(type(deleter), "submit", refused_once)
    return failed


def _recovered_by_the_stranded_resubmit(rt, keys, deleting, kept):
    """The retried finish hands nothing over again (an early second deletion could overlap a
    first one that did start): the locations stay DELETING until their hand-off counts as
    lost, when the next reclaim round's stranded resubmit hands them to batched deletion."""
    assert all(locs.count((deleting, Status.DELETING)) == 1 for locs in _locations(rt, keys))
    assert rt.reclaim_job.run()["resubmitted"] == 0  # not lost yet: it could be in flight
    rt.clock.advance(rt.index.DELETION_LOST_AFTER_S + rt.index.DUE_STEP_S)
    assert rt.reclaim_job.run()["resubmitted"] == len(keys)
    assert wait_for(lambda: _locations(rt, keys) == [[(kept, Status.SERVING)]] * len(keys), 20)


def test_failed_targets_whose_hand_over_failed_are_deleted_by_the_stranded_resubmit(tiers, monkeypatch):
    rt = tiers.runtime
    _write(rt, [1, 2, 3])
    ctx = rt.contexts("t1")
    before = rt.index.usage([ctx.layout])[0]
    failed = _first_hand_over_fails(monkeypatch, rt.copy_tasks.deleter)
    monkeypatch.setattr(migrations, "copy_blocks", _broken_copy)
    done = _copy(tiers, [1, 2, 3])
    assert done["status"] == "SUCCEEDED" and failed == [3]  # AbandonCopy retried after the refusal
    ((result),) = json.loads(done["output"])["results"]
    assert (result["served"], result["failed"]) == (0, 3)
    _recovered_by_the_stranded_resubmit(rt, [1, 2, 3], "s3_01", "nfs_01")
    assert wait_for(lambda: _counts(rt.index.usage([ctx.layout])[0]) == _counts(before), 5)
    # Counted once, by the finish that closed the session (not by its retry).
    assert _exported("migration.") == {("migration.tasks_submitted_total", ROUTE): 3, _completed("abandoned"): 3}


@pytest.mark.parametrize("tiers", ["MIGRATION_RETENTION_DELETE_SOURCE"], indirect=True)
def test_sources_whose_hand_over_failed_are_deleted_by_the_stranded_resubmit(tiers, monkeypatch):
    rt = tiers.runtime
    _write(rt, [1, 2])
    ctx = rt.contexts("t1")
    failed = _first_hand_over_fails(monkeypatch, rt.copy_tasks.deleter)
    done = _copy(tiers, [1, 2])
    assert done["status"] == "SUCCEEDED" and failed == [2]  # FinishCopy retried after the refusal
    ((result),) = json.loads(done["output"])["results"]
    assert (result["served"], result["sources_deleted"]) == (2, 0)
    _recovered_by_the_stranded_resubmit(rt, [1, 2], "nfs_01", "s3_01")
    usage = _counts(rt.index.usage([ctx.layout])[0])
    assert (usage["bytes"], usage["keys"], usage["deleting_bytes"]) == (2 * BLOCK, 2, 0)
    assert usage["by_type"] == {"ST_S3": 2 * BLOCK}


def test_a_copy_session_id_names_the_execution_once(tiers):
    """The execution's name already starts with the prefix the reaper tells Copy sessions by."""
    rt = tiers.runtime
    _write(rt, [1])
    done = _copy(tiers, [1])
    name = done["executionArn"].rsplit(":", 1)[1]
    assert name.startswith(migrations.COPY_SESSION_PREFIX)
    ((result),) = json.loads(done["output"])["results"]
    assert result["session_id"] == f"{name}-0"


PREFIX, BATCH = int(QueryType.QT_PREFIX_MATCH), int(QueryType.QT_BATCH_GET)


def _served_storages(rt, keys, query_type=PREFIX):
    """The storage each answered location of a getCacheLocation is on ('' for a miss)."""
    read = rt.cache.get_cache_location(
        GetCacheLocationRequest(instance_id="t1", query_type=query_type, block_keys=keys)
    )
    uris = [loc["location_specs"][0]["uri"] for loc in read.locations]
    return [uri.split("/")[2] if uri else "" for uri in uris]


def _refresh(rt):
    """A fresh container's view of the control plane (the storage's availability, the group)."""
    rt.config.invalidate()
    rt.contexts.forget("t1")


def test_a_block_with_copies_on_two_tiers_is_served_from_the_hottest_available_one(tiers):
    rt = tiers.runtime
    keys = list(range(1, 7))
    _write(rt, keys)
    assert _copy(tiers, keys[:4])["status"] == "SUCCEEDED"  # KEEP_BOTH: 1-4 on both tiers, 5-6 on nfs_01 only
    assert _served_storages(rt, keys, query_type=PREFIX) == ["nfs_01"] * 6  # the route's source is the hot tier
    # getCacheMeta lists both copies of a block, hot one first (the record's order)
    listed = _api("getCacheMeta", {"instance_id": "t1", "block_keys": [1, 5]})["replica_locations"]
    assert [[c["type"] for c in entry["locations"]] for entry in listed] == [["ST_NFS", "ST_S3"], ["ST_NFS"]]
    assert {c["status"] for entry in listed for c in entry["locations"]} == {"CLS_SERVING"}
    # getCacheLocationsByBackend answers each type from that type's copy
    by_backend = _api(
        "getCacheLocationsByBackend",
        {
            "instance_id": "t1",
            "query_type": "QT_BATCH_GET",
            "block_keys": [1, 5],
            "backend_selectors": [
                {"backend_type": "ST_S3", "strategy": "LSS_WEIGHTED_RANDOM"},
                {"backend_type": "ST_NFS", "strategy": "LSS_WEIGHTED_RANDOM"},
            ],
        },
    )["key_locations"]
    assert [[loc["type"] for loc in key["locations"]] for key in by_backend] == [["ST_S3", "ST_NFS"], ["ST_NFS"]]
    # the hot storage disabled: its blocks are served from the next tier, the prefix ends
    # at the first block no available tier holds
    rt.control.set_storage_available("nfs_01", False)
    _refresh(rt)
    assert _served_storages(rt, keys, query_type=PREFIX) == ["s3_01"] * 4
    assert _served_storages(rt, keys, query_type=BATCH) == ["s3_01"] * 4 + ["", ""]
    rt.control.set_storage_available("nfs_01", True)
    # The tier order is the group's routes, not the backends' read weights: with the route
    # reversed (s3_01 hotter), the copied blocks come from S3 and the prefix runs on into
    # the blocks only NFS holds.
    group = rt.control.get_group("tiers")
    (route,) = group.cache_config.migration_config.strategies
    route.source_storage_name, route.target_storage_name = "s3_01", "nfs_01"
    stored, group.version = group.version, 0
    rt.control.update_group(group, stored)
    _refresh(rt)
    assert _served_storages(rt, keys, query_type=PREFIX) == ["s3_01"] * 4 + ["nfs_01"] * 2


def test_a_hot_storage_found_unhealthy_is_skipped_for_the_next_tier(tiers, tmp_path):
    rt = tiers.runtime
    keys = [1, 2, 3]
    _write(rt, keys)
    assert _copy(tiers, keys)["status"] == "SUCCEEDED"
    assert _served_storages(rt, keys) == ["nfs_01"] * 3
    root = Path(rt.contexts("t1").backend("nfs_01").data_root)
    root.rename(tmp_path / "moved")  # the NFS mount gone: its probe fails
    rt.health_checks.run_health_checks()
    _refresh(rt)
    assert _served_storages(rt, keys) == ["s3_01"] * 3


def test_admin_migrate_cache_marks_blocks_whose_next_write_goes_to_the_target(tiers):
    """MARK over HTTP: the marked blocks' next startWriteCache writes them to s3_01, their
    finish clears the Marks (migration.marks_*); BOTH copies what it can and marks the rest;
    a malformed request names its field and marks nothing."""
    rt = tiers.runtime
    _write(rt, [1, 2, 3])
    ctx = rt.contexts("t1")
    mark = {"instance_id": "t1", "method": "MIGRATION_METHOD_MARK", "source_storage_name": "nfs_01"}
    for body, field in (
        ({**mark, "target_storage_name": "s3x", "block_keys": [1]}, "target_storage_name"),
        ({**mark, "target_storage_name": "s3_01"}, "block_keys"),
        ({**mark, "method": "MIGRATION_METHOD_MARK", "block_keys": [1]}, "target_storage_name"),
    ):
        answer = _api("migrateCache", body)
        assert answer["header"]["status"]["code"] == "INVALID_ARGUMENT", answer
        assert f"field '{field}'" in answer["header"]["status"]["message"]
    assert rt.index.client.hget(ctx.layout.key("u"), "mk") is None  # nothing written

    answer = _api("migrateCache", {**mark, "target_storage_name": "s3_01", "block_keys": [1, "2", 2, 99]})
    assert answer["header"]["status"]["code"] == "OK", answer
    assert (answer["accepted"], answer["rejected"], answer.get("execution_arn", "")) == ("2", "1", "")
    start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="t1", block_keys=[1, 2, 3]))
    assert start.block_mask == BlockMask(bool_masks={"values": [False, False, True]})
    assert all(loc["location_specs"][0]["uri"].startswith("s3://s3_01/") for loc in start.locations)
    rt.cache.finish_write_cache(
        FinishWriteCacheRequest(
            instance_id="t1", write_session_id=start.write_session_id, success_blocks=BlockMask(offset=2)
        )
    )
    assert _locations(rt, [1, 2]) == [[("nfs_01", Status.SERVING), ("s3_01", Status.SERVING)]] * 2
    group = (("instance_group", "tiers"),)
    exported = _exported("migration.marks")
    assert exported[("migration.marks_consumed_total", group)] == 2
    assert exported[("migration.marks_active", (*group, ("instance_id", "t1")))] == 0

    # BOTH: key 3 (SERVING on nfs_01) goes to the Copy; 99 (no record) is not marked.
    both = _api("migrateCache", {**mark, "method": 3, "target_storage_name": "s3_01", "block_keys": [3, 99]})
    assert (both["accepted"], both["rejected"]) == ("1", "1") and both["execution_arn"]
    assert wait_execution(tiers.sfn, both["execution_arn"], timeout_s=60)["status"] == "SUCCEEDED"
