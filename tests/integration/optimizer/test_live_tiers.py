"""Two tiers under a trace (issue 24): the conversation trace replayed through a live
group with a hot 3FS storage (a file mount; its type's ``quota_config``: ``HOT`` blocks,
``CPS_ALWAYS_3FS``: writes land there only) over a cold S3 one (moto; ``COLD`` blocks) and
a strategy 3FS → S3 that demotes the reclaimer's victims
(``demote_on_reclaim``, retention DELETE_SOURCE) instead of deleting them, compared with
the same hot quota alone and with the optimizer's tiered simulation (``tiered_replay``,
strategy ``demote``, the ``kvcm`` policy on each tier).

As test_live.py: the replay runs in-process on a manual clock, reclaim rounds every second
of trace time, the write path's eviction in the starts, deletions inline. The engine's
bytes are written at every location a start places before its finish (``EngineWrites``),
so a Copy reads real source bytes. **The Copies run in-process**: the reclaimer's demoter
(``TierDemotions``, which begins each batch in the round) is given ``InProcessCopies``,
which runs the very ``CopyTasks`` steps (begin, finding the session made → copy → finish)
that the tier_copy state machine calls, synchronously at the end of the round; moto's
interpreter runs on the wall clock and would take minutes for the trace's thousands of
demotions (the ASL is tested in tests/integration/workflows).

``OPTIMIZER_LIVE_TIER_REQUESTS`` and ``OPTIMIZER_LIVE_TIER_BLOCKS`` (``hot,cold``) replay
another prefix or other quotas.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from itertools import islice
from typing import Any

import boto3
import pytest

from chalicelib.index.migration import MigrationIndex
from chalicelib.optimizer.replay import ReplayConfig, replay
from chalicelib.optimizer.tiered import Strategy, TieredConfig, TieredResult, TierSpec, tiered_replay
from chalicelib.optimizer.traces import read_trace
from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.runtime import set_runtime
from chalicelib.workflows.demotion import TierDemotions
from tests.helpers import CONVERSATION, build_runtime

from .live_replay import (
    BLOCK_BYTES,
    BLOCK_TOKENS,
    EngineWrites,
    InProcessCopies,
    LiveRun,
    block_bytes,
    recount,
    replay_live,
    storage_of,
)

pytestmark = pytest.mark.slow  # replays the trace through the live service with moto S3: about a minute a run

# The first 2.75 minutes of the conversation trace (14k block reads, 12k blocks written).
REQUESTS = int(os.environ.get("OPTIMIZER_LIVE_TIER_REQUESTS", "500"))
HOT, COLD = (int(c) for c in os.environ.get("OPTIMIZER_LIVE_TIER_BLOCKS", "1500,4000").split(","))
BUCKET = "cold"
HOT_STORAGE = "hot_3fs"
#: Every how many-th cold hit has its S3 bytes read and compared with the engine's.
COLD_BYTES_SAMPLE = 10
ROUND = {"round_s": 1.0}  # the local scheduler's reclaim round, every second


@pytest.fixture(scope="module")
def records():
    return list(islice(read_trace(CONVERSATION, "mooncake"), REQUESTS))


def _group(tiers: int) -> InstanceGroup:
    """Group "g": 3FS with a type quota of HOT blocks, where every write goes; with two
    tiers also S3 (COLD blocks) and the demoting strategy 3FS → S3."""
    quota_config = [{"storage_type": "ST_3FS", "capacity": HOT * BLOCK_BYTES}]
    body: dict[str, Any] = {
        "name": "g",
        "storage_candidates": [HOT_STORAGE],
        "quota": {"quota_config": quota_config},
        "cache_config": {"data_storage_strategy": "CPS_ALWAYS_3FS"},
    }
    if tiers == 2:
        body["storage_candidates"].append("s3_01")
        quota_config.append({"storage_type": "ST_S3", "capacity": COLD * BLOCK_BYTES})
        body["cache_config"] |= {
            "migration_config": {
                "strategies": [
                    {
                        "source_storage_name": HOT_STORAGE,
                        "target_storage_name": "s3_01",
                        "trigger_threshold": 0.99,  # required; no trigger runs (no CopySubmitter)
                        "demote_on_reclaim": True,
                        "method_configs": {"copy": {"enabled": True}},
                        "retention": "MIGRATION_RETENTION_DELETE_SOURCE",
                    }
                ]
            }
        }
    return InstanceGroup.model_validate(body)


class ColdBytes:
    """Reads, for every ``COLD_BYTES_SAMPLE``-th hit served from S3, the object at its URI
    (what an engine fetches) and compares it with what the engine wrote for the block."""

    def __init__(self) -> None:
        self.s3 = boto3.client("s3")
        self.seen = 0
        self.checked = 0
        self.mismatched: list[int] = []

    def __call__(self, key: int, uri: str) -> None:
        if storage_of(uri) != "s3_01":
            return
        self.seen += 1
        if (self.seen - 1) % COLD_BYTES_SAMPLE:  # the first, the 11th, ...
            return
        # s3://<storage name>/<object key>?size=...: the storage's bucket is BUCKET
        object_key = uri.split("?")[0][len("s3://s3_01/") :]
        body = self.s3.get_object(Bucket=BUCKET, Key=object_key)["Body"].read()
        self.checked += 1
        if body != block_bytes(key):
            self.mismatched.append(key)


class TypeQuotas:
    """The peak of the group's live bytes per storage type, sampled after every round."""

    def __init__(self, runtime: Any, limits: dict[str, int]) -> None:
        self.runtime = runtime
        self.limits = limits
        self.peak: dict[str, int] = dict.fromkeys(limits, 0)

    def __call__(self) -> None:
        live = self.runtime.index.group_usage(["g"])[0].live().by_type
        for storage_type in self.limits:
            self.peak[storage_type] = max(self.peak[storage_type], live.get(storage_type, 0))


#: The live runs of this module by tier count: both tests read the figures of one run.
_RUNS: dict[int, LiveRun] = {}


def live_run(
    valkey, valkey_url, clock, tmp_path, records, tiers: int, checks: Callable[[Any, LiveRun], None] | None = None
) -> LiveRun:
    """``records`` through group "g" of ``tiers`` tiers (``_group``); ``checks(runtime, run)``
    runs at the end, before the runtime goes. Once per tier count and module (the first
    call's checks)."""
    if tiers in _RUNS:
        return _RUNS[tiers]
    runtime = build_runtime(valkey, valkey_url, clock, node_id="replay")
    (tmp_path / "3fs" / "kv").mkdir(parents=True)  # the 3FS mount and root
    try:
        runtime.control.add_storage(
            StorageConfig.model_validate(
                {
                    "global_unique_name": HOT_STORAGE,
                    "threefs": {"mountpoint": str(tmp_path / "3fs"), "root_dir": "kv", "key_count_per_file": 64},
                }
            )
        )
        limits = {"ST_3FS": HOT * BLOCK_BYTES}
        cold_bytes = None
        if tiers == 2:
            boto3.client("s3").create_bucket(Bucket=BUCKET)
            runtime.control.add_storage(
                StorageConfig.model_validate({"global_unique_name": "s3_01", "s3": {"bucket": BUCKET}})
            )
            limits["ST_S3"] = COLD * BLOCK_BYTES
            copies = InProcessCopies(runtime.copy_tasks)
            runtime.reclaim_job.reclaimer.demoter = TierDemotions(
                runtime.index,
                MigrationIndex(runtime.index),
                copies,
                runtime.deleter,
                clock,
                runtime.metrics,
                runtime.copy_quarantine,
            )
            cold_bytes = ColdBytes()
        runtime.control.create_group(_group(tiers))
        runtime.reclaim_job.reclaimer.rng = random.Random(HOT)  # seeded sampling
        quotas = TypeQuotas(runtime, limits)
        engine = EngineWrites(runtime)
        run = replay_live(runtime, clock, records, on_write=engine, on_hit=cold_bytes, after_round=quotas)
        quotas()  # and after the last write
        run.extra = {"peak_bytes": quotas.peak, "written": dict(engine.placed)}
        if cold_bytes is not None:
            run.extra |= {"cold_checked": cold_bytes.checked, "cold_mismatched": cold_bytes.mismatched}
            run.extra["copies"] = dict(copies.results)
        if checks is not None:
            checks(runtime, run)
        _RUNS[tiers] = run
        return run
    finally:
        set_runtime(None)


def simulated(records, tiers: int) -> TieredResult:
    """The optimizer's side: ``tiered_replay``, strategy demote, no promotion (a cold hit
    is served from S3, nothing copies it back), the kvcm policy on each tier."""
    specs = [TierSpec("3fs", HOT, "kvcm", ROUND), TierSpec("s3", COLD, "kvcm", ROUND)][:tiers]
    return tiered_replay(
        records, TieredConfig(tiers=tuple(specs), strategy=Strategy.DEMOTE, promote=False, block_size=BLOCK_TOKENS)
    )


def _exact_counters(runtime, run: LiveRun) -> None:
    """The instance's and the group's counters per type and per storage equal a recount
    of the records (DELETING ones too: the write path's last victims wait for a round)."""
    counted = recount(runtime, "i")
    usage = runtime.index.usage([runtime.contexts("i").layout])[0]
    nonzero = lambda counts: {k: v for k, v in counts.items() if v}  # noqa: E731
    assert (usage.bytes, usage.keys) == (counted.bytes, counted.keys)
    assert nonzero(usage.by_type) == nonzero(counted.by_type)
    assert nonzero(usage.by_storage) == nonzero(counted.by_storage)
    assert (usage.deleting_bytes, usage.deleting_keys) == (counted.deleting_bytes, counted.deleting_keys)
    assert nonzero(usage.deleting_by_type) == nonzero(counted.deleting_by_type)
    group = runtime.index.group_usage(["g"])[0]
    assert (group.bytes, group.keys, nonzero(group.by_type)) == (counted.bytes, counted.keys, nonzero(counted.by_type))
    run.extra["final_bytes"] = nonzero(counted.by_type)


def _two_runs(valkey, valkey_url, clock, tmp_path, records) -> tuple[LiveRun, LiveRun]:
    """The one-tier and the two-tier runs, their counters checked against the records."""
    one = live_run(valkey, valkey_url, clock, tmp_path / "one", records, 1, _exact_counters)
    two = live_run(valkey, valkey_url, clock, tmp_path / "two", records, 2, _exact_counters)
    hot, cold = two.storage_hit_ratio(HOT_STORAGE), two.storage_hit_ratio("s3_01")
    print(
        f"one tier {one.hit_ratio:.4f} (written {one.extra['written']}); two tiers {two.hit_ratio:.4f} "
        f"(3fs {hot:.4f}, s3 {cold:.4f}); copies {two.extra['copies']}; written {two.extra['written']}; "
        f"peak bytes {two.extra['peak_bytes']}; final {two.extra['final_bytes']}"
    )
    return one, two


def test_the_cold_tier_serves_the_engines_bytes_and_each_tier_keeps_its_quota(
    valkey, valkey_url, aws, clock, tmp_path, records
):
    one, two = _two_runs(valkey, valkey_url, clock, tmp_path, records)
    assert set(one.hits_by_storage) <= {HOT_STORAGE}
    # Blocks were demoted and served from S3; what an engine reads at the cold URIs is what
    # the engine wrote at the hot ones.
    assert two.extra["copies"]["served"] > 0 and two.hits_by_storage["s3_01"] > 0
    assert two.extra["cold_checked"] >= 10 and two.extra["cold_mismatched"] == []
    # Quotas exact per tier: never passed at a round (nor at the end), and the counters
    # equal the records (_exact_counters, in each run).
    for run, limits in ((one, {"ST_3FS": HOT}), (two, {"ST_3FS": HOT, "ST_S3": COLD})):
        for storage_type, blocks in limits.items():
            assert run.extra["peak_bytes"][storage_type] <= blocks * BLOCK_BYTES, (storage_type, run.extra)


def test_the_cold_tier_serves_the_blocks_one_tier_would_have_dropped(valkey, valkey_url, aws, clock, tmp_path, records):
    one, two = _two_runs(valkey, valkey_url, clock, tmp_path, records)
    hot, cold = two.storage_hit_ratio(HOT_STORAGE), two.storage_hit_ratio("s3_01")
    # The hot tier writes about what one tier writes (a little less: a parent whose child is
    # cold is never dropped by the write path), and serves about what it serves; the cold
    # tier adds its hits.
    assert two.extra["written"][HOT_STORAGE] >= 0.9 * one.extra["written"][HOT_STORAGE]
    assert abs(hot - one.hit_ratio) <= 0.02
    assert cold > 0.01
    assert two.hit_ratio >= one.hit_ratio + 0.8 * cold


@pytest.mark.parametrize("tiers", [1, 2])
def test_the_live_tiers_agree_with_the_tiered_simulation(valkey, valkey_url, aws, clock, tmp_path, records, tiers):
    live = live_run(valkey, valkey_url, clock, tmp_path, records, tiers)
    sim = simulated(records, tiers)
    names = [HOT_STORAGE, "s3_01"][:tiers]
    per_tier = ", ".join(
        f"{name} live {live.storage_hit_ratio(name):.4f} simulated {stats.hit_ratio:.4f}"
        for name, stats in zip(names, sim.tiers, strict=True)
    )
    print(f"{tiers} tier(s): live {live.hit_ratio:.4f} simulated {sim.hit_ratio:.4f} ({per_tier})")
    assert abs(sim.hit_ratio - live.hit_ratio) <= 0.02, (live.hit_ratio, sim.hit_ratio, per_tier)
    # and tier by tier: a total may agree while the tiers serve different blocks
    for name, stats in zip(names, sim.tiers, strict=True):
        assert abs(live.storage_hit_ratio(name) - stats.hit_ratio) <= 0.02, (name, per_tier)
    if tiers == 1:  # the tiered simulation of one tier is test_live.py's single-tier kvcm replay
        single = replay(records, ReplayConfig(HOT, "kvcm", block_size=BLOCK_TOKENS, policy_params=ROUND))
        assert sim.hit_ratio == single.totals.block_hit_ratio
