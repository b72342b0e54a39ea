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

import os
import random
from itertools import islice

import pytest

from chalicelib.optimizer.replay import ReplayConfig, replay
from chalicelib.optimizer.traces import read_trace
from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.runtime import set_runtime
from tests.helpers import CONVERSATION, build_runtime

from .live_replay import BLOCK_BYTES, BLOCK_TOKENS, replay_live

pytestmark = pytest.mark.slow  # replays the conversation trace through the live service: 10-20 s a capacity

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
        return replay_live(runtime, clock, records).hit_ratio
    finally:
        set_runtime(None)


def simulated_hit_ratio(records, capacity: int, seed: int = 0) -> float:
    config = ReplayConfig(
        capacity=capacity, policy="kvcm", block_size=BLOCK_TOKENS, seed=seed, policy_params={"round_s": 1.0}
    )
    return replay(records, config).totals.block_hit_ratio


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_simulated_kvcm_agrees_with_the_live_service(valkey, valkey_url, aws, clock, tmp_path, records, capacity):
    live = live_hit_ratio(valkey, valkey_url, clock, tmp_path, records, capacity)
    simulated = simulated_hit_ratio(records, capacity)
    lru = replay(records, ReplayConfig(capacity=capacity, block_size=BLOCK_TOKENS)).totals.block_hit_ratio
    print(f"capacity {capacity}: live {live:.4f} simulated {simulated:.4f} ideal lru {lru:.4f}")
    assert abs(simulated - live) <= 0.02, (capacity, live, simulated, lru)
    assert live > 0.04  # the capacities are in the range where eviction matters
