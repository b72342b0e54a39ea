"""The simulated KVCM policy agrees with KVCM itself: the same trace replayed through the
live data plane (CacheService over a real Valkey, the reclaimer's rounds and the
write-path eviction, all in-process on a manual clock) and through the optimizer's
``kvcm`` policy gives block hit ratios within 2 % at three capacities.

On a prefix-chained trace an instance holds about one leaf per chain, so the candidate
pool usually takes in every leaf and both sides evict the same blocks: the agreement is
then exact. ``OPTIMIZER_LIVE_REQUESTS`` and ``OPTIMIZER_LIVE_CAPACITIES`` (comma list)
replay more of the trace (the whole trace: 12031 requests, about 10 minutes per capacity).
"""

from __future__ import annotations

import math
import os
import random
from itertools import islice

import pytest
from chalice.test import Client

from chalicelib.optimizer.replay import ReplayConfig, replay
from chalicelib.optimizer.traces import read_trace
from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.runtime import set_runtime
from tests.helpers import api_caller, build_runtime, register_one_spec_instance

from .test_tasks import CONVERSATION

pytestmark = pytest.mark.slow  # replays the conversation trace through the live service: 10-20 s a capacity

BLOCK_BYTES = 1024
# the first 5.5 minutes of the conversation trace (27k block reads); ideal LRU hit ratios
# of 4 %, 11 % and 17 % at these capacities (blocks)
REQUESTS = int(os.environ.get("OPTIMIZER_LIVE_REQUESTS", "1000"))
CAPACITIES = [int(c) for c in os.environ.get("OPTIMIZER_LIVE_CAPACITIES", "2500,5000,9000").split(",")]


@pytest.fixture(scope="module")
def records():
    return list(islice(read_trace(CONVERSATION, "mooncake"), REQUESTS))


def live_hit_ratio(valkey, valkey_url, clock, tmp_path, records, capacity: int) -> float:
    """Block hit ratio of ``records`` replayed through the local data plane, reclaim rounds
    every second of trace time (as the local scheduler runs them)."""
    runtime = build_runtime(valkey, valkey_url, clock, node_id="replay")
    try:
        runtime.control.add_storage(
            StorageConfig.model_validate(
                {
                    "global_unique_name": "nfs_01",
                    "nfs": {"root_path": str(tmp_path / f"nfs{capacity}"), "key_count_per_file": 64},
                }
            )
        )
        runtime.control.create_group(
            InstanceGroup.model_validate(
                {"name": "g", "storage_candidates": ["nfs_01"], "quota": {"capacity": capacity * BLOCK_BYTES}}
            )
        )
        # seeded sampling: the reclaimer's rounds draw buckets from this RNG
        runtime.reclaim_job.reclaimer.rng = random.Random(capacity)
        with Client(__import__("app").app) as client:
            call = api_caller(client)
            register_one_spec_instance(call, 512, BLOCK_BYTES)
            start_s = math.floor(clock.now())
            clock.advance(start_s + 1 - clock.now())  # trace time 0 = a whole second
            base = clock.now()
            hits = reads = 0
            next_round = base + 1
            for record in records:
                at = base + record.timestamp_us / 1e6
                while next_round <= at:  # the scheduler's ticks on the way
                    clock.advance(next_round - clock.now())
                    runtime.reclaim_job.run()
                    next_round += 1
                clock.advance(at - clock.now())
                keys = list(record.keys)
                found = call(
                    "getCacheLocation", {"instance_id": "i", "block_keys": keys, "query_type": "QT_PREFIX_MATCH"}
                )
                hits += len(found["locations"])
                reads += len(keys)
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
            return hits / reads
    finally:
        set_runtime(None)


def simulated_hit_ratio(records, capacity: int, seed: int = 0) -> float:
    config = ReplayConfig(capacity=capacity, policy="kvcm", block_size=512, seed=seed, policy_params={"round_s": 1.0})
    return replay(records, config).totals.block_hit_ratio


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_simulated_kvcm_agrees_with_the_live_service(valkey, valkey_url, aws, clock, tmp_path, records, capacity):
    live = live_hit_ratio(valkey, valkey_url, clock, tmp_path, records, capacity)
    simulated = simulated_hit_ratio(records, capacity)
    lru = replay(records, ReplayConfig(capacity=capacity, block_size=512)).totals.block_hit_ratio
    print(f"capacity {capacity}: live {live:.4f} simulated {simulated:.4f} ideal lru {lru:.4f}")
    assert abs(simulated - live) <= 0.02, (capacity, live, simulated, lru)
    assert live > 0.04  # the capacities are in the range where eviction matters
