"""The per-instance tuning job's logic (optimizer/instance_tuning.py) on a written event
log: a looping instance whose working set fits only with more quota, a streaming one
that gains nothing from any quota."""

from __future__ import annotations

import json
import logging

import pytest

from chalicelib.control.groups import default_tuning, normalize_group
from chalicelib.observability.event_store import PartitionedEventWriter
from chalicelib.optimizer.instance_tuning import EventLogSource, InstanceTuning, current_quotas
from chalicelib.protocol.models import InstanceGroup
from chalicelib.storage.objects import DirectoryStore

BLOCK = 1024
CAPACITY = 100 * BLOCK
START_US = 1_764_000_000_000_000
LOOP_CHAINS, CHAIN = 16, 4  # a 64-block working set: 45 blocks (an even share x 0.9) miss it all


class FixedClock:
    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now


class FakeGroups:
    """The control plane as the job sees it, with versioned updates."""

    def __init__(self, group: InstanceGroup, instances: dict[str, int]) -> None:
        self.group = normalize_group(group)
        self.group.version = 1
        self.instances = instances
        self.updates: list[InstanceGroup] = []
        self.conflict = False

    def groups(self) -> list[InstanceGroup]:
        group = self.group.model_copy(deep=True)
        group.tuning = group.tuning or default_tuning()
        return [group]

    def block_bytes(self, group: str) -> dict[str, int]:
        return dict(self.instances)

    def update(self, group: InstanceGroup, current_version: int) -> bool:
        if self.conflict or current_version != self.group.version:
            return False
        stored = normalize_group(group)
        stored.version = self.group.version + 1
        self.group = stored
        self.updates.append(stored)
        return True


def write_traffic(writer: PartitionedEventWriter, group: str = "g1", cycles: int = 5, spacing_us: int = 1000) -> int:
    """Interleaved requests of 'loop' (cycling over its chains) and 'stream' (new blocks
    each time): read, start, finish, ``spacing_us`` apart. Returns the last event's time (µs)."""
    t = START_US
    fresh = 10_000_000
    for n in range(cycles * LOOP_CHAINS):
        chain = n % LOOP_CHAINS
        requests = [
            ("loop", [chain * 100 + b for b in range(CHAIN)]),
            ("stream", list(range(fresh + n * CHAIN, fresh + (n + 1) * CHAIN))),
        ]
        for instance, keys in requests:
            session = f"{instance}-{n}"
            for kind, extra in (
                ("GetCacheLocation", {"keys": keys, "query_type": "prefix_match", "block_mask": 0}),
                ("StartWriteCache", {"keys": keys, "write_session_id": session}),
                ("FinishWriteCache", {"write_session_id": session, "success_block": len(keys)}),
            ):
                t += spacing_us
                writer.append(
                    group,
                    t,
                    json.dumps({"source": instance, "type": kind, "trigger_time_us": t, "tokens": [], **extra}),
                )
    writer.flush()
    return t


def job(tmp_path, group_fields: dict | None = None, instances: dict[str, int] | None = None, spacing_us: int = 1000):
    store = DirectoryStore(str(tmp_path))
    end_us = write_traffic(PartitionedEventWriter(store, "log"), spacing_us=spacing_us)
    group = InstanceGroup.model_validate(
        {"name": "g1", "storage_candidates": ["s"], "quota": {"capacity": CAPACITY}, **(group_fields or {})}
    )
    groups = FakeGroups(group, instances or {"loop": BLOCK, "stream": BLOCK})
    tuning = InstanceTuning(
        groups,
        EventLogSource(store, "log"),
        store,
        FixedClock(end_us / 1e6 + 1),
        logging.getLogger("test"),
        output_prefix="log",
        reclaim_round_s=1.0,
    )
    return tuning, groups


def test_an_opted_in_group_moves_quota_to_the_instance_that_gains(tmp_path):
    tuning, groups = job(tmp_path, {"tuning": {"enabled": True, "max_shift": 0.5}})
    (summary,) = tuning.run()["groups"]
    assert summary["status"] == "applied"
    quotas = groups.group.instance_quotas
    assert groups.group.version == 2 and len(groups.updates) == 1
    assert sum(quotas.values()) == CAPACITY
    # the loop's 64 blocks fit under its new quota's watermark; the stream keeps its floor at least
    assert quotas["loop"] * 0.9 // BLOCK >= LOOP_CHAINS * CHAIN and quotas["stream"] >= CAPACITY // 8
    assert summary["expected_gain"] > 0.3
    (written,) = (tmp_path / "log" / "tuning" / "g1").rglob("*.json")
    rec = json.loads(written.read_text())
    assert summary["output"] == str(written)
    assert rec["status"] == "applied" and rec["current"]["quotas"] == {"loop": CAPACITY // 2, "stream": CAPACITY // 2}
    assert rec["recommended"]["quotas"] == quotas and rec["current"]["group_hit_ratio"] == 0.0


def test_without_opting_in_it_only_recommends(tmp_path):
    tuning, groups = job(tmp_path)
    (summary,) = tuning.run()["groups"]
    assert summary["status"] == "recommended" and summary["changes"]["loop"] > 0
    assert groups.updates == [] and groups.group.instance_quotas == {}
    # the default step: at most 0.2 of the quota changes hands
    assert summary["changes"]["loop"] <= 0.2 * CAPACITY


def test_a_concurrent_change_leaves_the_group_for_the_next_run(tmp_path):
    tuning, groups = job(tmp_path, {"tuning": {"enabled": True}})
    groups.conflict = True
    assert tuning.run()["groups"][0]["status"] == "conflict"
    assert groups.updates == [] and groups.group.version == 1


def test_a_gain_below_min_gain_changes_nothing(tmp_path):
    tuning, groups = job(tmp_path, {"tuning": {"enabled": True, "min_gain": 0.99}})
    assert tuning.run()["groups"][0]["status"] == "below_min_gain" and groups.updates == []


def test_groups_without_quota_or_traffic_are_left_alone(tmp_path):
    tuning, groups = job(tmp_path, {"quota": {"capacity": 0}})
    assert tuning.run()["groups"][0]["status"] == "no_quota"
    tuning, groups = job(tmp_path, instances={"someone-else": BLOCK})  # no registered instance was seen
    assert tuning.run()["groups"][0]["status"] == "no_traffic"


def test_instance_quotas_in_bytes_follow_each_instance_block_size(tmp_path):
    # the loop's blocks are 4x larger: the same 64 blocks need 4x the bytes
    tuning, groups = job(
        tmp_path,
        {"quota": {"capacity": 4 * CAPACITY}, "tuning": {"enabled": True, "max_shift": 1}},
        instances={"loop": 4 * BLOCK, "stream": BLOCK},
    )
    assert tuning.run()["groups"][0]["status"] == "applied"
    assert groups.group.instance_quotas["loop"] * 0.9 // (4 * BLOCK) >= LOOP_CHAINS * CHAIN


def test_current_quotas_share_what_the_set_ones_leave():
    group = normalize_group(
        InstanceGroup.model_validate(
            {"name": "g", "storage_candidates": ["s"], "quota": {"capacity": 1000}, "instance_quotas": {"a": 400}}
        )
    )
    assert current_quotas(group, ["a", "b", "c"]) == {"a": 400, "b": 300, "c": 300}
    assert current_quotas(group, ["b", "c", "d"]) == {"b": 200, "c": 200, "d": 200}


@pytest.mark.parametrize("bad", [{"max_shift": 0}, {"window_seconds": 0}])
def test_defaults_fill_a_partial_tuning(bad):
    group = normalize_group(
        InstanceGroup.model_validate(
            {"name": "g", "storage_candidates": ["s"], "quota": {"capacity": 1}, "tuning": bad}
        )
    )
    assert group.tuning.max_shift == 0.2 and group.tuning.window_seconds == 3600


def _reclaim_strategy(**fields) -> dict:
    return {"cache_config": {"reclaim_strategy": {"trigger_period_seconds": 1, **fields}}}


def test_a_ttl_group_gets_the_ttl_its_reuse_needs_one_bounded_step_a_run(tmp_path):
    # 0.5 s between events: each loop chain comes back every 48 s, past the 10 s TTL
    fields = {**_reclaim_strategy(reclaim_policy="POLICY_TTL", ttl_seconds=10), "tuning": {"enabled": True}}
    tuning, groups = job(tmp_path, fields, spacing_us=500_000)
    (summary,) = tuning.run()["groups"]
    assert summary["status"] == "applied"
    assert summary["reclaim"] == {"parameter": "ttl_seconds", "current": 10, "recommended": 20}
    (written,) = (tmp_path / "log" / "tuning" / "g1").rglob("*.json")
    reclaim = json.loads(written.read_text())["reclaim"]
    assert reclaim["optimum"] >= 48 and reclaim["reuse_time_s"]["p50"] >= 48
    assert groups.group.cache_config.reclaim_strategy.ttl_seconds == 20  # doubled at most
    assert groups.group.instance_quotas["loop"] > CAPACITY // 2  # the quotas moved in the same update
    assert len(groups.updates) == 1 and groups.group.version == 2


def test_an_lru_group_gets_the_watermark_that_holds_its_quotas_hit_ratio(tmp_path):
    # the loop's 64 blocks fit in its 80-block quota, not under a 0.5 watermark of it
    fields = {
        **_reclaim_strategy(trigger_strategy={"used_percentage": 0.5}),
        "tuning": {"enabled": True},
        "instance_quotas": {"loop": 80 * BLOCK, "stream": 20 * BLOCK},
    }
    tuning, groups = job(tmp_path, fields, spacing_us=500_000)
    (summary,) = tuning.run()["groups"]
    assert summary["status"] == "applied" and summary["changes"] == {}
    assert summary["reclaim"] == {"parameter": "used_percentage", "current": 0.5, "recommended": 0.55}
    (written,) = (tmp_path / "log" / "tuning" / "g1").rglob("*.json")
    reclaim = json.loads(written.read_text())["reclaim"]
    by_used = {c["value"]: c["hit_ratio"] for c in reclaim["candidates"]}
    reference = reclaim["reference"]["hit_ratio"]
    assert by_used[0.5] < reference - 0.1 and by_used[reclaim["optimum"]] >= reference - 0.01
    assert 64 / 80 <= reclaim["optimum"] < 0.95
    assert groups.group.cache_config.reclaim_strategy.trigger_strategy.used_percentage == 0.55
    assert groups.group.instance_quotas == fields["instance_quotas"] and groups.group.version == 2


def test_a_window_shorter_than_a_few_reclaim_looks_recommends_no_reclaim_parameter(tmp_path):
    tuning, _ = job(tmp_path, _reclaim_strategy(reclaim_policy="POLICY_TTL", ttl_seconds=10))  # 0.5 s of traffic
    (summary,) = tuning.run()["groups"]
    assert summary["reclaim"] == {}
