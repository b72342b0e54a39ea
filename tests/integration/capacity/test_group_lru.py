"""Group-LRU reclaim on a real Valkey index: one recency order across a group's instances,
by sampling, leaves first, stopping when the water level recovers."""

from __future__ import annotations

import pytest

from chalicelib.observability.metrics import MetricsRegistry

from .harness import make_group
from .test_reclaim import run_until_settled


def recent_and_old(cluster, index, clock, budget):
    """Instance ``a`` holds 30 recently read blocks, ``b`` 10 older ones; the group is 10
    blocks over its trigger. Returns (a's keys, b's keys)."""
    index.client.flushall()
    cluster.contexts.clear()
    cluster.group = make_group(capacity_blocks=40, used_percentage=0.75, step_percentage=100, budget=budget)
    cluster.add_instance("a")
    cluster.add_instance("b")
    old = [k for chain in cluster.chains("b", count=10, length=1) for k in chain]
    clock.advance(100)
    recent = [k for chain in cluster.chains("a", count=30, length=1) for k in chain]
    return recent, old


@pytest.mark.parametrize("budget", [None, "GROUP_LRU"])
def test_group_lru_takes_the_globally_oldest_blocks(cluster, index, clock, budget):
    recent, old = recent_and_old(cluster, index, clock, budget)
    report = cluster.reclaimer().run_round()
    assert report.victims == 10
    assert set(cluster.records("a")) == set(recent)  # the recent instance keeps everything
    assert set(cluster.records("b")) == set()  # the old one loses its ten, though it is the smaller


def test_per_instance_budgets_take_recent_blocks_where_group_lru_would_not(cluster, index, clock):
    recent, old = recent_and_old(cluster, index, clock, "USAGE_PROPORTIONAL")
    cluster.reclaimer().run_round()
    # 3/4 of the need comes from `a`: recent blocks go while older ones in `b` stay
    assert len(cluster.records("a")) < len(recent)
    assert cluster.records("b")


def test_group_lru_counts_its_plans(cluster, index, clock):
    recent_and_old(cluster, index, clock, "GROUP_LRU")
    reclaimer = cluster.reclaimer()
    reclaimer.metrics = MetricsRegistry()
    reclaimer.run_round()
    assert reclaimer.metrics.value("group_lru_plan_count", {"instance_group": "g"}) == 1
    assert reclaimer.metrics.value("group_lru_partial_plan_count", {"instance_group": "g"}) is None


def test_group_lru_takes_chains_from_their_leaves_across_instances(cluster, clock):
    cluster.group = make_group(capacity_blocks=64, used_percentage=0.75, step_percentage=100)
    cluster.add_instance("a")
    cluster.add_instance("b")
    old = {"a": cluster.chains("a", count=2, length=4)}
    clock.advance(10)
    old["b"] = cluster.chains("b", count=2, length=4)
    clock.advance(10)
    cluster.chains("a", count=6, length=4)
    cluster.chains("b", count=6, length=4)
    # 64 blocks, trigger 48: the 16 oldest are the four old chains, two in each instance.
    # run_until_settled checks that no block outlives its parent.
    assert run_until_settled(cluster, cluster.reclaimer()) == [16]
    old_left = {i: sum(k in cluster.records(i) for chain in chains for k in chain) for i, chains in old.items()}
    # Victims are the worst fifth of the pool at a time (approximated LRU): a chain's
    # parents join as its leaves go, so a fresh leaf may go before the last old parent.
    assert sum(old_left.values()) <= 2, old_left


def test_group_lru_stops_when_the_water_level_recovers(cluster, clock):
    cluster.group = make_group(capacity_blocks=100, used_percentage=0.5, step_percentage=5)
    for instance_id in ("a", "b", "c"):
        cluster.add_instance(instance_id)
        cluster.chains(instance_id, count=20, length=1)
        clock.advance(5)
    report = cluster.reclaimer().run_round()
    assert report.victims == 5  # one step of 5 % of 100 blocks, not more
    assert len(cluster.records("a")) == 15 and len(cluster.records("b")) == len(cluster.records("c")) == 20


def test_a_group_with_a_key_cap_frees_each_instance_over_it(cluster, clock):
    cluster.group = make_group(max_keys=20, used_percentage=0.5, step_percentage=100, budget="GROUP_LRU")
    cluster.add_instance("a")
    cluster.add_instance("b")
    cluster.chains("a", count=20, length=1)
    cluster.chains("b", count=8, length=1)
    report = cluster.reclaimer().run_round()
    assert {r.instance_id: r.victims for r in report.groups[0].instances} == {"a": 10}
    assert (cluster.used("a").keys, cluster.used("b").keys) == (10, 8)


def test_an_instance_whose_sampling_fails_leaves_a_partial_plan(cluster, index, clock, monkeypatch):
    recent, old = recent_and_old(cluster, index, clock, "GROUP_LRU")
    sample = index.occupied_sample

    def failing_for_b(layout, count):
        if layout.instance_id == "b":
            raise ConnectionError("shard of b down")
        return sample(layout, count)

    monkeypatch.setattr(index, "occupied_sample", failing_for_b)
    reclaimer = cluster.reclaimer()
    reclaimer.metrics = MetricsRegistry()
    report = reclaimer.run_round()
    assert report.victims == 10 and not report.groups[0].error  # the plan goes on with `a` alone
    assert len(cluster.records("a")) == 20 and set(cluster.records("b")) == set(old)
    assert reclaimer.metrics.value("group_lru_partial_plan_count", {"instance_group": "g"}) == 1
