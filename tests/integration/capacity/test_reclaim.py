"""The reclaimer on a real Valkey index: watermarks, policies, leaf order, expiry."""

from __future__ import annotations

import random

import pytest

from chalicelib.cache.deletion import DeletionService, InlineDeleter
from chalicelib.clock import ManualClock
from chalicelib.index import BlockIndex, Status

from .harness import BLOCK, Cluster, counting_client, make_group, server_calls


def run_until_settled(cluster, reclaimer, max_rounds=20):
    """Rounds until one frees nothing; returns the victims of each round that did."""
    freed = []
    for _ in range(max_rounds):
        report = reclaimer.run_round()
        for instance_id in cluster.contexts:
            cluster.assert_no_orphans(instance_id)
        if report.victims == 0:
            return freed
        freed.append(report.victims)
    raise AssertionError(f"still reclaiming after {max_rounds} rounds: {freed}")


def test_usage_settles_under_a_lowered_watermark_one_step_per_round(cluster, index):
    cluster.group = make_group(capacity_blocks=100, used_percentage=1.0)
    cluster.add_instance("i1")
    cluster.chains("i1", count=25, length=4)
    reclaimer = cluster.reclaimer()
    assert cluster.used("i1").bytes == 100 * BLOCK
    report = reclaimer.run_round()
    assert report.groups[0].reason == "period" and report.victims == 0

    assert reclaimer.run_round().groups == []  # unchanged: not due before trigger_period_seconds
    cluster.group = make_group(capacity_blocks=100, used_percentage=0.5)
    # Lowered: due at once (issue 22), then while over, 10 % of the capacity per round.
    assert run_until_settled(cluster, reclaimer) == [10] * 5
    assert cluster.used("i1").bytes == 50 * BLOCK


@pytest.mark.parametrize(
    "budget, victims",
    [
        ("USAGE_PROPORTIONAL", {"big": 15, "small": 5}),  # in proportion to usage
        ("FIXED_PER_INSTANCE", {"big": 10, "small": 10}),  # equal shares
    ],
)
def test_per_instance_budgets_spread_the_need(cluster, budget, victims):
    cluster.group = make_group(capacity_blocks=80, used_percentage=0.5, step_percentage=25, budget=budget)
    for instance_id, blocks in (("big", 60), ("small", 20)):
        cluster.add_instance(instance_id)
        cluster.chains(instance_id, count=blocks, length=1)
    report = cluster.reclaimer().run_round()
    assert {r.instance_id: r.victims for r in report.groups[0].instances} == victims
    assert (cluster.used("big").keys, cluster.used("small").keys) == (60 - victims["big"], 20 - victims["small"])


def test_writing_blocks_are_never_reclaimed(cluster):
    cluster.group = make_group(capacity_blocks=40, used_percentage=0.25, step_percentage=100)
    cluster.add_instance("i1")
    serving = cluster.chains("i1", count=10, length=2)
    writing = cluster.chains("i1", count=10, length=2, finish=False)
    run_until_settled(cluster, cluster.reclaimer())
    statuses = cluster.statuses("i1")
    assert not any(k in statuses for chain in serving for k in chain)
    assert all(statuses[k] == Status.WRITING for chain in writing for k in chain)
    assert cluster.used("i1").keys == 20


def test_recently_read_blocks_outlive_older_unread_ones(cluster, clock):
    cluster.group = make_group(capacity_blocks=40, used_percentage=0.6, step_percentage=100)
    cluster.add_instance("i1")
    chains = cluster.chains("i1", count=20, length=2)
    clock.advance(2)
    for chain in chains[:10]:
        cluster.read("i1", chain)
    assert run_until_settled(cluster, cluster.reclaimer()) == [16]
    left = cluster.records("i1")
    read = {k for chain in chains[:10] for k in chain}
    assert read <= set(left) and len(left) == 24


def test_children_go_before_their_parents(cluster, clock):
    cluster.group = make_group(capacity_blocks=50, used_percentage=0.4, step_percentage=10)
    cluster.add_instance("i1")
    chains = cluster.chains("i1", count=10, length=3)
    clock.advance(30)
    # Extend every chain: the new blocks are the most recent, their parents the oldest,
    # so plain LRU would take the parents first.
    tails = [cluster.keys(2) for _ in chains]
    for chain, tail in zip(chains, tails, strict=True):
        cluster.write("i1", chain + tail)
    assert run_until_settled(cluster, cluster.reclaimer()) == [5, 5, 5, 5, 5, 5]
    left = cluster.records("i1")
    assert len(left) == 20
    for chain, tail in zip(chains, tails, strict=True):
        full = chain + tail
        kept = [k in left for k in full]
        assert kept == sorted(kept, reverse=True), "a chain lost a block before its descendants"


def test_lfu_prefers_rarely_read_blocks_where_lru_would_not(cluster, index, clock):
    def scenario(policy):
        index.client.flushall()
        cluster.contexts.clear()
        cluster.group = make_group(capacity_blocks=40, used_percentage=0.5, step_percentage=100, policy=policy)
        cluster.add_instance("i1")
        often = cluster.chains("i1", count=20, length=1)
        for _ in range(3):
            clock.advance(1.5)
            for chain in often:
                cluster.read("i1", chain)
        clock.advance(10)
        # written later (more recent), never read: a lower access count
        rarely = cluster.chains("i1", count=20, length=1)
        clock.advance(1)
        run_until_settled(cluster, cluster.reclaimer())
        left = set(cluster.records("i1"))
        return left == {c[0] for c in often}, left == {c[0] for c in rarely}

    assert scenario("POLICY_LFU") == (True, False)
    assert scenario("POLICY_LRU") == (False, True)


def test_ttl_expires_idle_blocks_whatever_the_watermark(cluster, clock):
    cluster.group = make_group(capacity_blocks=10_000, policy="POLICY_TTL", ttl_seconds=60)
    cluster.add_instance("i1")
    stale = cluster.chains("i1", count=5, length=3)
    parent_of_fresh = cluster.keys(1)
    cluster.write("i1", parent_of_fresh)
    clock.advance(50)
    fresh = cluster.chains("i1", count=5, length=1)
    fresh_child = cluster.keys(1)
    cluster.write("i1", parent_of_fresh + fresh_child)
    reclaimer = cluster.reclaimer()
    assert reclaimer.run_round().victims == 0  # nothing idle for 60 s yet

    clock.advance(20)
    report = reclaimer.run_round()
    assert report.groups[0].swept and report.groups[0].plan.needed is False
    left = set(cluster.records("i1"))
    # whole stale chains went (leaf first) in one round; a stale parent with a fresh
    # child stays while the child lives
    assert left == {c[0] for c in fresh} | set(parent_of_fresh + fresh_child)
    assert not left & {key for chain in stale for key in chain}
    assert report.victims == report.groups[0].instances[0].expired == 15
    cluster.assert_no_orphans("i1")


def test_a_type_over_its_quota_loses_blocks_of_that_type_only(cluster):
    cluster.group = make_group(
        capacity_blocks=1000, used_percentage=0.5, step_percentage=100, type_quota={"ST_NFS": 20}
    )
    cluster.add_instance("i1")
    nfs = cluster.chains("i1", count=20, length=1, storage="nfs_01")
    s3 = cluster.chains("i1", count=20, length=1, storage="s3_01")
    run_until_settled(cluster, cluster.reclaimer())
    left = set(cluster.records("i1"))
    assert {c[0] for c in s3} <= left
    assert len(left & {c[0] for c in nfs}) == 10
    assert cluster.used("i1").by_type == {"ST_NFS": 10 * BLOCK, "ST_S3": 20 * BLOCK}


def test_key_count_watermark(cluster):
    cluster.group = make_group(max_keys=40, used_percentage=0.5, step_percentage=25)
    cluster.add_instance("i1")
    cluster.chains("i1", count=40, length=1)
    assert run_until_settled(cluster, cluster.reclaimer()) == [10, 10]
    assert cluster.used("i1").keys == 20


class ParkedDeleter:
    """Accepts deletions and runs them only when told (a slow deletion workflow)."""

    def __init__(self, index):
        self.service = DeletionService(index)
        self.parked = []

    def submit(self, ctx, victims, delay_ms=0):
        self.parked.append((ctx, list(victims), delay_ms))

    def run(self):
        for ctx, victims, _ in self.parked:
            self.service.delete(ctx, victims)
        self.parked = []


def test_marked_but_undeleted_blocks_are_not_reclaimed_twice(cluster):
    cluster.group = make_group(capacity_blocks=40, used_percentage=0.5, step_percentage=25, delay_ms=5000)
    cluster.add_instance("i1")
    cluster.chains("i1", count=40, length=1)
    deleter = ParkedDeleter(cluster.index)
    reclaimer = cluster.reclaimer(deleter=deleter)
    assert reclaimer.run_round().victims == 10
    assert {d for _, _, d in deleter.parked} == {5000}
    # usage still counts the 10 DELETING blocks; the next round credits them
    assert cluster.used("i1").keys == 40
    assert reclaimer.run_round().victims == 10
    assert reclaimer.run_round().victims == 0
    assert sum(len(v) for _, v, _ in deleter.parked) == 20
    deleter.run()
    assert cluster.used("i1").keys == 20
    assert reclaimer.run_round().victims == 0


def test_each_submission_is_published_as_an_event(cluster, clock):
    cluster.group = make_group(capacity_blocks=10, used_percentage=0.5, step_percentage=100, delay_ms=250)
    cluster.add_instance("i1")
    cluster.chains("i1", count=10, length=1)
    cluster.reclaimer().run_round()
    events = cluster.event_lines()
    assert events
    submitted = []
    for event in events:
        assert (event["type"], event["source"], event["component"]) == ("CacheReclaimSubmit", "i1", "cache_manager")
        assert event["trigger_time_us"] == int(clock.now() * 1_000_000) and event["delay_us"] == 250_000
        assert len(event["location_ids"]) == len(event["block_keys"])
        assert all(len(ids) == 1 and ids[0].isdigit() for ids in event["location_ids"])
        submitted += event["block_keys"]
    assert len(set(submitted)) == 5 and not set(submitted) & set(cluster.records("i1"))


def race_before_mark(index, action) -> None:
    """Run ``action(block_keys)`` between the reclaimer's sampling and its next mark."""
    real_mark = index.mark_deleting

    def racing_mark(layout, block_keys, *args, **kwargs):
        index.mark_deleting = real_mark
        action(block_keys)
        return real_mark(layout, block_keys, *args, **kwargs)

    index.mark_deleting = racing_mark


def test_a_concurrently_rewritten_block_is_left_alone(cluster, index):
    """The compare-and-set: a victim is taken only if its sampled location still serves."""
    cluster.group = make_group(capacity_blocks=4, used_percentage=0.5, step_percentage=100)
    ctx = cluster.add_instance("i1", bucket_bits=4)
    cluster.chains("i1", count=4, length=1)
    reclaimer = cluster.reclaimer()
    rewritten = []

    def rewrite_first(block_keys):  # another call removes and rewrites the first key
        DeletionService(index).delete(ctx, index.mark_deleting(ctx.layout, [block_keys[0]], [BLOCK]))
        cluster.write("i1", [block_keys[0]])
        rewritten.append((block_keys[0], cluster.records("i1")[block_keys[0]].locations[0].location_id))

    race_before_mark(index, rewrite_first)
    report = reclaimer.run_round()
    ((key, location_id),) = rewritten
    records = cluster.records("i1")
    assert report.victims == 2 and len(records) == 2
    # the rewritten block was sampled under its old location: its new one is untouched
    assert records[key].locations[0].location_id == location_id
    assert records[key].locations[0].status == Status.SERVING


def test_a_leaf_that_gains_a_child_before_its_mark_is_left_alone(cluster, index):
    """Leaves before parents holds under a racing write: the mark re-checks the child count."""
    cluster.group = make_group(capacity_blocks=6, used_percentage=0.5, step_percentage=100)
    cluster.add_instance("i1", bucket_bits=4)
    cluster.chains("i1", count=4, length=1)
    reclaimer = cluster.reclaimer()
    extended = []

    def extend_first(block_keys):  # an engine writes a block after the first key
        child = cluster.keys(1)[0]
        cluster.write("i1", [block_keys[0], child])
        extended.append((block_keys[0], child))

    race_before_mark(index, extend_first)
    reclaimer.run_round()
    ((parent, child),) = extended
    records = cluster.records("i1")
    assert records[parent].children == 1
    assert records[parent].locations[0].status == Status.SERVING
    assert records[child].locations[0].status == Status.SERVING


def test_a_lost_lease_stops_the_round_and_a_failing_group_is_reported(cluster, index, monkeypatch):
    cluster.group = make_group(capacity_blocks=10, used_percentage=0.5, step_percentage=100)
    cluster.add_instance("i1")
    cluster.chains("i1", count=10, length=1)
    reclaimer = cluster.reclaimer()
    report = reclaimer.run_round(keep_going=lambda: False)
    assert report.interrupted and report.groups == [] and cluster.used("i1").keys == 10

    def broken(layout):
        raise ConnectionError("Valkey went away")

    monkeypatch.setattr(index, "storage_table", broken)
    report = reclaimer.run_round()
    assert report.groups[0].error == "ConnectionError: Valkey went away"
    assert report.to_dict()["groups"][0]["plan"]["bytes"] == 5 * BLOCK
    monkeypatch.undo()
    # the failed group is not "over": it waits for its period, or a wake-up
    assert reclaimer.run_round().groups == []
    index.request_reclaim("g")
    assert reclaimer.run_round().victims == 5


def test_deletions_whose_hand_off_failed_are_resubmitted_once_due(cluster, index, clock):
    cluster.group = make_group(capacity_blocks=1000, delay_ms=30_000)
    ctx = cluster.add_instance("i1")
    cluster.write("i1", [1, 2, 3])
    cluster.write("i1", [4, 5], finish=False)
    clock.advance(7200)  # written long ago: what counts is when they turned DELETING
    # Marked DELETING by removeCache (handed over after the group's delay) and a failed
    # finish (at once), neither handed to deletion.
    index.mark_deleting(ctx.layout, [3], [BLOCK], delay_ms=30_000)
    session = index.session(ctx.layout, "s2")
    index.finish(ctx.layout, "s2", session, [False, False], [BLOCK])
    reclaimer = cluster.reclaimer()

    clock.advance(index.DELETION_LOST_AFTER_S - 1)  # still within the grace
    assert reclaimer.run_round().resubmitted == 0
    assert cluster.statuses("i1") == {
        1: Status.SERVING,
        2: Status.SERVING,
        3: Status.DELETING,
        4: Status.DELETING,
        5: Status.DELETING,
    }

    clock.advance(1 + index.DUE_STEP_S)
    assert reclaimer.run_round().resubmitted == 2  # the finish's; the removal's waits for its delay
    assert cluster.statuses("i1") == {1: Status.SERVING, 2: Status.SERVING, 3: Status.DELETING}
    clock.advance(30)
    assert reclaimer.run_round().resubmitted == 1
    assert cluster.statuses("i1") == {1: Status.SERVING, 2: Status.SERVING}
    assert (cluster.used("i1").keys, cluster.used("i1").bytes) == (2, 2 * BLOCK)
    assert index.client.zcard(ctx.layout.key("pd")) == 0
    # The hand-overs' own registrations go once they fall due, finding nothing.
    clock.advance(index.DELETION_LOST_AFTER_S + index.DUE_STEP_S)
    assert reclaimer.run_round().resubmitted == 0
    assert index.due_deletions(int(clock.now()) + 10**6, 100) == {}


def test_a_registration_whose_mark_never_ran_goes_after_one_look(cluster, index, clock):
    """The instance is registered as due before its script: a process dying in between
    leaves a registration with nothing pending, which the first round past it drops."""
    cluster.group = make_group(capacity_blocks=1000)
    ctx = cluster.add_instance("i1")
    register_due(index, ctx.layout)
    clock.advance(index.DELETION_LOST_AFTER_S + index.DUE_STEP_S)
    assert list(index.due_deletions(int(clock.now()), 100)) == ["i1"]
    assert cluster.reclaimer().run_round().resubmitted == 0
    assert index.due_deletions(int(clock.now()), 100) == {}


def test_an_instance_failing_its_recovery_stays_due_and_does_not_stop_the_others(cluster, index, clock):
    cluster.group = make_group(capacity_blocks=1000)
    for name, key in (("i1", 1), ("i2", 2)):
        cluster.add_instance(name)
        cluster.write(name, [key])
        index.mark_deleting(cluster.context(name).layout, [key], [BLOCK])  # never handed over
    clock.advance(index.DELETION_LOST_AFTER_S + index.DUE_STEP_S)
    reclaimer = cluster.reclaimer()
    healthy = reclaimer.stranded.contexts

    def contexts(instance_id):
        if instance_id == "i1":
            raise ConnectionError("control plane unreachable")
        return healthy(instance_id)

    reclaimer.stranded.contexts = contexts
    assert reclaimer.stranded.recover() == 1
    assert cluster.statuses("i2") == {} and cluster.statuses("i1") == {1: Status.DELETING}
    assert list(index.due_deletions(int(clock.now()), 100)) == ["i1"]
    reclaimer.stranded.contexts = healthy
    assert reclaimer.stranded.recover() == 1 and cluster.statuses("i1") == {}


def test_a_pending_entry_whose_location_is_not_deleting_is_dropped_never_acted_on(cluster, index, clock, valkey):
    """The recovery takes lost deletions only: an entry naming a SERVING location (a state
    no script leaves) neither deletes it nor stays."""
    from chalicelib.index.layout import SESSION_ENTRY

    cluster.group = make_group(capacity_blocks=1000)
    ctx = cluster.add_instance("i1")
    cluster.write("i1", [1])
    location = cluster.records("i1")[1].locations[0].location_id
    valkey.zadd(ctx.layout.key("pd"), {SESSION_ENTRY.pack((1).to_bytes(8, "big"), location): 0})
    register_due(index, ctx.layout)
    clock.advance(index.DELETION_LOST_AFTER_S + index.DUE_STEP_S)
    assert cluster.reclaimer().stranded.recover() == 0
    assert cluster.statuses("i1") == {1: Status.SERVING}
    assert valkey.zcard(ctx.layout.key("pd")) == 0 and index.due_deletions(int(clock.now()), 100) == {}


def test_one_round_finds_a_lost_deletion_whatever_the_number_of_instances(cluster, index, clock):
    cluster.group = make_group(capacity_blocks=100_000)
    for n in range(40):
        cluster.add_instance(f"i{n:02}")
        cluster.write(f"i{n:02}", [n + 1])
    index.mark_deleting(cluster.context("i39").layout, [40], [BLOCK])  # never handed over
    clock.advance(index.DELETION_LOST_AFTER_S + index.DUE_STEP_S)
    assert cluster.reclaimer().run_round().resubmitted == 1
    assert cluster.statuses("i39") == {}


def test_a_lost_deletion_among_many_instances_is_found_in_one_round_at_the_cost_of_what_is_due(valkey_url):
    """Issue #28 item 10: the sweep visited 8 instances a round, so with 680 instances a
    lost deletion waited more than 18 minutes. Recovery reads what is due: one round
    finds it whatever the number of instances, and its commands do not grow with them."""

    def recovery_calls(instances: int) -> tuple[int, int]:
        client, _ = counting_client(valkey_url)
        client.flushall()
        clock = ManualClock()
        cluster = Cluster(BlockIndex(client, "t", clock), clock, rng=random.Random(5))
        cluster.group = make_group(capacity_blocks=100_000)
        for n in range(instances):
            cluster.add_instance(f"i{n:04}")
            cluster.write(f"i{n:04}", [n + 1])
        last = cluster.context(f"i{instances - 1:04}")
        cluster.index.mark_deleting(last.layout, [instances], [BLOCK])  # never handed over
        clock.advance(cluster.index.DELETION_LOST_AFTER_S + cluster.index.DUE_STEP_S)
        reclaimer = cluster.reclaimer()
        client.config_resetstat()
        resubmitted = reclaimer.stranded.recover()
        calls = server_calls(client)
        assert cluster.statuses(last.instance_id) == {}
        client.close()
        return resubmitted, calls

    recovery_calls(10)  # loads the scripts
    few, many = recovery_calls(10), recovery_calls(300)
    assert few[0] == many[0] == 1
    assert many[1] == few[1], (few, many)


def test_a_stranded_deletion_failing_again_does_not_stop_the_reclaim(cluster, index, clock):
    from chalicelib.protocol.errors import StorageIOError

    cluster.group = make_group(capacity_blocks=100, used_percentage=0.5)
    ctx = cluster.add_instance("i1")
    cluster.chains("i1", count=20, length=4)
    stranded = cluster.keys(1)
    cluster.write("i1", stranded)
    index.mark_deleting(ctx.layout, stranded, [BLOCK])  # its deletion was never handed over
    clock.advance(index.DELETION_LOST_AFTER_S + 1)
    inline = InlineDeleter(DeletionService(index))

    class BrokenStorage:
        def submit(self, ctx, victims, delay_ms=0):
            if any(v.block_key in stranded for v in victims):
                raise StorageIOError("nfs_01: delete failed")
            inline.submit(ctx, victims, delay_ms)

    report = cluster.reclaimer(deleter=BrokenStorage()).run_round()

    assert (report.groups[0].error, report.resubmitted) == ("", 0)
    assert report.victims > 0 and cluster.statuses("i1")[stranded[0]] == Status.DELETING


def register_due(index, layout):
    """The registration a mark queues ahead of its script, sent alone (its script never ran)."""
    pipe = index.client.pipeline(transaction=False)
    index.queue_due(pipe, layout, index.pending_deadline())
    pipe.execute()
