"""Live hit-ratio curves end to end in process: a generated trace replayed through the
API (CacheService over a real Valkey, the reclaimer's rounds and write-path eviction on a
manual clock) feeds the hit feed; the ``hit_curves`` schedule, run now and then during
the replay, keeps the group's curve; getGroupHitCurve serves it, and at the group's
quota it is within 0.02 of the hit ratio the group really achieved (blocks found /
blocks asked, its own counters)."""

from __future__ import annotations

import math

import pytest
from chalice.test import Client

from chalicelib.optimizer.tracegen import TraceShape, generate_records
from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.runtime import set_runtime
from tests.helpers import api_caller, build_runtime, register_one_spec_instance

pytestmark = pytest.mark.slow  # about 1,000 requests through the live service: a minute or more

BLOCK_BYTES = 4096
QUOTA_BLOCKS = 6000
TIME_SCALE = 40  # trace milliseconds to seconds of replay: a reclaim round every 25 requests
SHAPE = TraceShape(distinct_blocks=30_000, seed=7, live=300, reuse_skew=0.8, prompt_blocks=16)


@pytest.fixture
def replayed(valkey, valkey_url, aws, clock, tmp_path):
    runtime = build_runtime(valkey, valkey_url, clock, node_id="replay")
    try:
        runtime.control.add_storage(
            StorageConfig.model_validate(
                {"global_unique_name": "nfs_01", "nfs": {"root_path": str(tmp_path / "nfs"), "key_count_per_file": 64}}
            )
        )
        runtime.control.create_group(
            InstanceGroup.model_validate(
                {"name": "g", "storage_candidates": ["nfs_01"], "quota": {"capacity": QUOTA_BLOCKS * BLOCK_BYTES}}
            )
        )
        with Client(__import__("app").app) as client:
            call = api_caller(client)
            register_one_spec_instance(call, 16, BLOCK_BYTES)
            clock.advance(math.floor(clock.now()) + 1 - clock.now())
            base = clock.now()
            next_round = base + 1
            runs = []
            for n, record in enumerate(generate_records(SHAPE)):
                at = base + record.timestamp_us / 1e6 * TIME_SCALE
                while next_round <= at:
                    clock.advance(next_round - clock.now())
                    runtime.reclaim_job.run()
                    next_round += 1
                clock.advance(at - clock.now())
                keys = [k + 1 for k in record.keys]
                call("getCacheLocation", {"instance_id": "i", "block_keys": keys, "query_type": "QT_PREFIX_MATCH"})
                start = call("startWriteCache", {"instance_id": "i", "block_keys": keys})
                if start["header"]["status"]["code"] == "OK" and start["locations"]:
                    fin = call(
                        "finishWriteCache",
                        {
                            "instance_id": "i",
                            "write_session_id": start["write_session_id"],
                            "success_blocks": {"offset": len(start["locations"])},
                        },
                    )
                    assert fin["header"]["status"]["code"] == "OK", fin
                if n % 400 == 399:
                    runs.append(runtime.hit_curves.run())  # the schedule continues its saved state
            runs.append(runtime.hit_curves.run())
            tags = {"instance_id": "i"}
            found = runtime.metrics.value("manager.get_cache_location_hit_block_counter", tags)
            asked = runtime.metrics.value("manager.get_cache_location_query_block_counter", tags)
            curve = call("getGroupHitCurve", {"name": "g"})
            yield runtime, runs, found / asked, curve, call
    finally:
        set_runtime(None)


def test_the_live_curve_at_the_quota_is_within_0_02_of_the_achieved_hit_ratio(replayed):
    runtime, runs, achieved, curve, call = replayed
    assert curve["header"]["status"]["code"] == "OK", curve
    assert len(runs) > 3 and all(r["entries"] > 0 for r in runs[:-1])
    live = curve["hit_ratio_at_quota"]
    print(
        f"achieved {achieved:.4f} live {live:.4f} x0.5 {curve['hit_ratio_at_half_quota']:.4f} "
        f"x2 {curve['hit_ratio_at_double_quota']:.4f}"
    )
    assert 0.1 < achieved < 0.9  # the quota is in the range where eviction matters
    assert abs(live - achieved) <= 0.02, (live, achieved)
    assert curve["hit_ratio_at_half_quota"] < live < curve["hit_ratio_at_double_quota"]
    assert int(curve["quota_bytes"]) == QUOTA_BLOCKS * BLOCK_BYTES
    ratios = [p["hit_ratio"] for p in curve["points"]]
    assert ratios == sorted(ratios)  # more room never loses hits
    (instance,) = curve["instances"]
    assert instance["instance_id"] == "i" and int(instance["kept_keys"]) <= runtime.settings.hit_curve_s_max
    assert instance["hit_ratio"] == pytest.approx(live)  # the group's only instance
    assert int(curve["updated_time_ms"]) >= int(curve["through_time_ms"]) > 0
    assert curve["confident"] is True and int(instance["kept_keys"]) >= int(curve["min_kept_keys"])
    # the metrics export the same figures
    gauge = runtime.metrics.value("kvcm.hit_curve.hit_ratio", {"instance_group": "g", "quota": "x1"})
    assert gauge == pytest.approx(live)
    # the tuning job reads the live curves (no event log here) and its recommendation is served
    (tuned,) = runtime.instance_tuning.run()["groups"]
    assert tuned["status"] == "recommended", tuned
    rec = call("getGroupHitCurve", {"name": "g"})["recommendation"]
    assert rec["hit_ratio"] == pytest.approx(live) and rec["instance_quotas"] == {"i": QUOTA_BLOCKS * BLOCK_BYTES}
    # nothing new: the run reads the stream lengths and stops
    assert runtime.hit_curves.run() == {"groups": 0, "entries": 0}
    assert runtime.valkey.xlen(runtime.hit_curve_store.stream("i")) == 0
