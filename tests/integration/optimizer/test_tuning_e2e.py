"""Per-instance tuning end to end on the real pieces: the data plane over Valkey behind the
HTTP routes, the control plane and the event log in moto (DynamoDB, S3), the app's own
schedules (``reclaim`` every second of clock time, then ``instance_tuning``) run as the
local stack's scheduler runs them.

Two instances share a group quota of 100 blocks: ``loop`` cycles over a 64-block working
set, ``stream`` writes new blocks on every request. Sharing the quota, the stream's
blocks push the loop's out before they come round again: the group hits nothing. The
tuning job reads the group's event log from S3, shifts quota to the loop with a versioned
update, and the same traffic replayed then hits the loop's working set.
"""

from __future__ import annotations

import json

import pytest
from chalice.test import Client

from chalicelib.observability.event_store import group_prefix
from chalicelib.protocol.models import InstanceGroup, StorageConfig
from local_stack.scheduler import app_jobs
from tests.helpers import api_caller

BLOCK = 1024
CAPACITY = 100 * BLOCK
CHAINS, CHAIN = 16, 4  # the loop's working set: 64 blocks
CYCLES = 5
BUCKET = "kvcm-test-events"


@pytest.fixture
def runtime_settings():
    return {"node_id": "tuning-e2e", "event_log_path": f"s3://{BUCKET}/kvcm"}


@pytest.fixture
def stack(runtime, clock, tmp_path):
    runtime.aws("s3").create_bucket(Bucket=BUCKET)
    runtime.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": str(tmp_path / "nfs"), "key_count_per_file": 64}}
        )
    )
    runtime.control.create_group(
        InstanceGroup.model_validate(
            {
                "name": "g1",
                "storage_candidates": ["nfs_01"],
                "quota": {"capacity": CAPACITY},
                "tuning": {"enabled": True, "max_shift": 0.5, "window_seconds": 3600},
            }
        )
    )
    import app

    jobs = {job.name: job for job in app_jobs(app.app, {}, "us-east-1", clock)}
    with Client(app.app) as client:
        call = api_caller(client)
        for instance in ("loop", "stream"):
            resp = call(
                "registerInstance",
                {
                    "instance_group": "g1",
                    "instance_id": instance,
                    "block_size": 16,
                    "location_spec_infos": [{"name": "tp0", "size": BLOCK}],
                    "model_deployment": {"model_name": "m", "dtype": "fp16"},
                },
            )
            assert resp["header"]["status"]["code"] == "OK", resp
        yield runtime, call, jobs


def traffic(call, jobs, clock, phase: int) -> float:
    """One pass of both instances' requests (read, write, finish), a reclaim round every
    second; returns the group's block hit ratio from getCacheLocation."""
    hits = reads = 0
    for n in range(CYCLES * CHAINS):
        chain = n % CHAINS
        fresh = (phase * 1000 + n) * 100
        for instance, keys in (
            ("loop", [chain * 10 + b + 1 for b in range(CHAIN)]),
            ("stream", [10_000_000 + fresh + b for b in range(CHAIN)]),
        ):
            found = call(
                "getCacheLocation", {"instance_id": instance, "block_keys": keys, "query_type": "QT_PREFIX_MATCH"}
            )
            assert found["header"]["status"]["code"] == "OK", found
            hits += len(found["locations"])
            reads += len(keys)
            start = call("startWriteCache", {"instance_id": instance, "block_keys": keys})
            if start["header"]["status"]["code"] == "OK" and start["locations"]:
                fin = call(
                    "finishWriteCache",
                    {
                        "instance_id": instance,
                        "write_session_id": start["write_session_id"],
                        "success_blocks": {"offset": len(start["locations"])},
                    },
                )
                assert fin["header"]["status"]["code"] == "OK", fin
        clock.advance(0.5)
        if n % 2:
            jobs["reclaim"].run()  # the app's schedule, through its job wrapper (events flushed)
    return hits / reads


def test_tuning_shifts_quota_to_the_instance_that_gains_and_the_hit_ratio_rises(stack, clock):
    runtime, call, jobs = stack
    before = traffic(call, jobs, clock, phase=0)
    s3 = runtime.aws("s3")
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="kvcm/" + group_prefix("", "g1"))
    assert listed.get("KeyCount", 0) > 0  # the group's events are in S3, partitioned

    clock.advance(60)
    result = jobs["instance_tuning"].run()
    (summary,) = result["groups"]
    assert summary["status"] == "applied", result
    group = runtime.control.get_group("g1")
    assert group.version == 2
    quotas = group.instance_quotas
    assert quotas["loop"] > quotas["stream"] and sum(quotas.values()) <= CAPACITY
    assert quotas["loop"] * 0.9 // BLOCK >= CHAINS * CHAIN  # the working set fits under the watermark
    rec_key = summary["output"].removeprefix(f"s3://{BUCKET}/")
    rec = json.loads(s3.get_object(Bucket=BUCKET, Key=rec_key)["Body"].read())
    assert rec["recommended"]["quotas"] == quotas and rec["recommended"]["expected_gain"] > 0.2

    clock.advance(60)
    after = traffic(call, jobs, clock, phase=1)
    print(
        f"group block hit ratio: {before:.3f} before tuning, {after:.3f} after "
        f"(quotas {quotas}, expected gain {summary['expected_gain']:.3f})"
    )
    assert before < 0.05 and after >= before + 0.25
    # the stream is held to its own quota (write path and reclaimer), the loop kept its set
    usages = runtime.index.usage([runtime.contexts(i).layout for i in ("loop", "stream")])
    used = dict(zip(("loop", "stream"), usages, strict=True))
    assert used["stream"].live().bytes <= quotas["stream"]
    assert used["loop"].live().bytes >= CHAINS * CHAIN * BLOCK
