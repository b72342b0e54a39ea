"""An instance spread over three shards on a cluster-mode Valkey of three masters
(docs/instance-sharding.md), checked against an instance of one shard fed the same calls."""

import random
import threading
from dataclasses import replace

import pytest

from chalicelib.index import BlockIndex
from chalicelib.index.errors import QuotaExceededError
from chalicelib.index.records import decode_record
from chalicelib.index.sharding import shard_of
from chalicelib.index.types import MODE_BATCH, MODE_PREFIX, MODE_RAW, MODE_WINDOW, StartRequest

SIZE = 200


@pytest.fixture
def index(cluster3, clock):
    return BlockIndex(cluster3, "kvcm", clock)


@pytest.fixture
def sharded(index):
    return index.claim("sh", "inc-1", 4, registering=True, shard_count=3, group="gs")


@pytest.fixture
def reference(index):
    return index.claim("ref", "inc-1", 4, registering=True, shard_count=1, group="gr")


def keys_of(rng, count, shard=None):
    out = []
    while len(out) < count:
        key = rng.getrandbits(63) - (1 << 62)
        if shard is None or shard_of(key, 3) == shard:
            out.append(key)
    return out


def request(session_id, count, **extra):
    return replace(StartRequest(session_id, 2**47, "nfs", "ST_NFS", 4, [SIZE], [0] * count), **extra)


def write(index, layout, keys, session_id, success=None):
    """start then finish (``success``: per new key, default all)."""
    outcome = index.start(layout, keys, request(session_id, len(keys)))
    session = index.session(layout, session_id)
    mask = success(session.entries) if success else [True] * len(session.entries)
    index.finish(layout, session_id, session, mask, [SIZE])
    return outcome


def test_the_shards_land_on_the_three_masters(index, sharded, cluster3):
    assert sharded.shard_count == 3
    masters = {cluster3.nodes_manager.get_node_from_slot(cluster3.keyslot(shard.tag)).name for shard in sharded.shards}
    assert len(masters) == 3
    # the layout is the key space's: another container claiming it gets the same
    again = BlockIndex(cluster3, "kvcm", index.clock).claim("sh", "inc-1", 9, shard_count=3, group="gs")
    assert again.shard_suffixes == sharded.shard_suffixes and again.bucket_bits == 4


def test_every_read_mode_answers_as_one_shard_does(index, sharded, reference):
    rng = random.Random(7)
    chain = keys_of(rng, 60)
    failing = set(rng.sample(chain, 12))
    for layout in (sharded, reference):
        # the same calls in each: two writes, some blocks failed, a few removed
        write(index, layout, chain[:40], "s1", lambda entries: [k not in failing for k, _ in entries])
        write(index, layout, chain[20:60], "s2", lambda entries: [k not in failing for k, _ in entries])
        index.mark_deleting(layout, chain[50:53], [SIZE])
    served = [k not in failing and k not in chain[50:53] for k in chain]
    assert not all(served[:20])  # the prefix stops inside the request, as a real one does
    queries = [chain, chain[:10], chain[25:60], [chain[3], chain[0], chain[59]], keys_of(rng, 5) + chain[:5]]
    for keys in queries:
        covered = [i % 4 == 1 for i in range(len(keys))]
        for mode, sw, cover in [
            (MODE_PREFIX, 0, None),
            (MODE_PREFIX, 0, covered),
            (MODE_BATCH, 0, None),
            (MODE_RAW, 0, None),
            (MODE_WINDOW, 1, None),
            (MODE_WINDOW, 3, None),
            (MODE_WINDOW, 2, covered),
            (MODE_WINDOW, len(keys), None),
        ]:
            got, want = (index.read_raw(layout, keys, mode, sw, ("nfs",), cover) for layout in (sharded, reference))
            assert [r is None for r in got] == [r is None for r in want], (mode, sw, cover)
            assert [[loc.status for loc in decode_record(r).locations] for r in got if r] == [
                [loc.status for loc in decode_record(r).locations] for r in want if r
            ]
    usage_sharded, usage_reference = index.usage([sharded, reference])
    assert usage_sharded == usage_reference
    assert index.group_usage(["gs"]) == index.group_usage(["gr"])


def test_location_ids_and_storage_indexes_are_one_per_instance(index, sharded):
    rng = random.Random(3)
    keys = keys_of(rng, 30)
    index.start(sharded, keys, request("s1", len(keys)))
    index.start(sharded, keys_of(rng, 3, shard=2), request("s2", 3, storage_name="other"))
    ids = [loc for _, loc in index.session(sharded, "s1").entries]
    assert len(set(ids)) == 30
    # every shard names a storage by the same index
    assert [index.storage_names(s) for s in sharded.shards] == [{1: "nfs", 2: "other"}] * 3
    outcome = index.start(sharded, keys + keys_of(rng, 1), request("s3", 31))
    assert sum(outcome.new_flags) == 1 and outcome.new_flags[-1]


def test_a_finish_follows_the_order_of_the_start(index, sharded):
    rng = random.Random(5)
    keys = keys_of(rng, 24)
    index.start(sharded, keys, request("s1", 24))
    session = index.session(sharded, "s1")
    assert [k for k, _ in session.entries] == keys
    index.finish(sharded, "s1", session, [i % 2 == 0 for i in range(24)], [SIZE])
    served = index.read_raw(sharded, keys, MODE_BATCH)
    assert [r is not None for r in served] == [i % 2 == 0 for i in range(24)]
    assert index.session(sharded, "s1") is None


def test_a_start_refused_in_one_shard_leaves_nothing_in_the_others(index, sharded):
    rng = random.Random(11)
    # max_keys 6: 2 per shard; shard 1 is full
    write(index, sharded, keys_of(rng, 2, shard=1), "fill")
    before = index.usage([sharded])[0].fields(), index.group_usage(["gs"])[0].fields()
    keys = keys_of(rng, 2, shard=0) + keys_of(rng, 1, shard=1) + keys_of(rng, 2, shard=2)
    with pytest.raises(QuotaExceededError) as refused:
        index.start(sharded, keys, request("s1", len(keys), max_keys=6))
    assert refused.value.kind == "keys"
    assert index.read_raw(sharded, keys, MODE_RAW) == [None] * 5
    assert (index.usage([sharded])[0].fields(), index.group_usage(["gs"])[0].fields()) == before
    assert index.session(sharded, "s1") is None
    assert index.due_sessions(["sh"], 2**48) == {}
    # the other shards still take writes up to their share
    assert all(index.start(sharded, keys[:2] + keys[3:], request("s2", 4, max_keys=6)).new_flags)


def test_the_instance_quota_is_exact_in_each_shard(index, sharded):
    rng = random.Random(13)
    capacity = 3 * 2 * SIZE  # each shard holds 2 blocks
    in_shard_0 = keys_of(rng, 3, shard=0)
    index.start(sharded, in_shard_0[:2], request("s1", 2, instance_capacity=capacity))
    with pytest.raises(QuotaExceededError) as refused:
        index.start(sharded, in_shard_0[2:], request("s2", 1, instance_capacity=capacity))
    assert (refused.value.kind, refused.value.shortfall) == ("instance", SIZE)
    others = keys_of(rng, 2, shard=1) + keys_of(rng, 2, shard=2)
    assert all(index.start(sharded, others, request("s3", 4, instance_capacity=capacity)).new_flags)
    assert index.usage([sharded])[0].bytes == 6 * SIZE == index.group_usage(["gs"])[0].bytes


def test_expired_sessions_are_found_and_failed_in_every_shard(index, sharded):
    keys = keys_of(random.Random(17), 9)
    index.start(sharded, keys, request("s1", 9))
    assert index.due_sessions(["sh", "ref"], 2**48) == {"sh": ["s1"]}
    failed = index.finish(sharded, "s1", index.session(sharded, "s1"), (), [SIZE], force_fail=True)
    victims = failed.victims
    assert sorted(v.block_key for v in victims) == sorted(keys)
    assert index.due_sessions(["sh"], 2**48) == {}


def test_scans_samples_removal_and_purges_cover_every_shard(index, sharded):
    rng = random.Random(19)
    keys = keys_of(rng, 90)
    write(index, sharded, keys, "s1")
    assert all(index.occupied_count(shard) > 0 for shard in sharded.shards)
    assert sorted(k for k, _ in index.scan(sharded, page=3)) == sorted(keys)
    total, sample = index.occupied_sample(sharded, 8)
    assert total == index.occupied_count(sharded) and len(set(sample)) == 8
    assert {k for k, _ in index.read_buckets(sharded, sample)} <= set(keys)
    victims = index.mark_deleting(sharded, keys[:30], [SIZE])
    assert index.drop(sharded, victims, [SIZE]).dropped == 30
    index.set_removing(sharded, True)
    with pytest.raises(Exception, match="being removed"):
        index.start(sharded, keys_of(rng, 3), request("s2", 3))
    index.drop_all(sharded)
    assert index.occupied_count(sharded) == 0 and list(index.scan(sharded)) == []
    assert index.usage([sharded])[0].bytes == 0 and index.group_usage(["gs"])[0].bytes == 0


def test_a_registration_over_a_sharded_key_space_drops_every_shard(index, sharded):
    keys = keys_of(random.Random(23), 12)
    write(index, sharded, keys, "s1")
    taken = index.claim("sh", "inc-2", 4, registering=True, shard_count=2, group="gs")
    assert taken.shard_count == 2
    assert index.occupied_count(sharded) == 0 and index.read_raw(taken, keys, MODE_RAW) == [None] * 12
    assert index.group_usage(["gs"])[0].bytes == 0


def test_a_callers_open_sessions_count_down_in_every_shard_at_finish_and_expiry(index, sharded, cluster3):
    # start.lua counts the caller in each shard its start touched; the session closing there
    # (finish, or the reaper's forced fail) takes it back in the same script.
    rng = random.Random(23)
    capped = {"caller": "acct", "max_caller_sessions": 2}
    for n in range(3):  # finished sessions give their place back
        keys = keys_of(rng, 9)
        index.start(sharded, keys, request(f"f{n}", 9, **capped))
        session = index.session(sharded, f"f{n}")
        assert [k for k, _ in session.entries] == keys
        index.finish(sharded, f"f{n}", session, [True] * 9, [SIZE])
    for n in range(3):  # and so do failed ones
        index.start(sharded, keys_of(rng, 9), request(f"x{n}", 9, **capped))
        index.finish(sharded, f"x{n}", index.session(sharded, f"x{n}"), (), [SIZE], force_fail=True)
    assert [cluster3.hgetall(shard.key("sc")) for shard in sharded.shards] == [{}] * 3
    index.start(sharded, keys_of(rng, 9), request("o1", 9, **capped))
    assert [cluster3.hgetall(shard.key("sc")) for shard in sharded.shards] == [{b"acct": b"1"}] * 3


def test_forgetting_orphan_groups_clears_them_in_every_shard(index, sharded):
    rng = random.Random(29)
    keys = [k for s in range(3) for k in keys_of(rng, 4, shard=s)]
    index.start(sharded, keys, request("s1", 12))
    failed = index.finish(sharded, "s1", index.session(sharded, "s1"), (), [SIZE], force_fail=True)
    orphans = index.drop(sharded, failed.victims, [SIZE]).orphan_groups
    assert {shard_of(v.block_key, 3) for v in failed.victims} == {0, 1, 2}
    assert sorted(index.orphan_groups(sharded)) == sorted(orphans) and len(orphans) >= 3
    index.forget_orphan_groups(sharded, orphans)
    assert index.orphan_groups(sharded) == []


def test_marks_and_failed_finishes_register_the_instance_due_on_the_cluster(index, sharded, cluster3):
    # the registration rides in the script's pipeline, to the due set's own master
    rng = random.Random(31)
    keys = keys_of(rng, 9)
    write(index, sharded, keys, "s1")
    for node in cluster3.get_primaries():  # the masters answer NOSCRIPT: the script goes alone
        cluster3.get_redis_connection(node).script_flush()
    assert len(index.mark_deleting(sharded, keys[:5], [SIZE])) == 5
    due = index.due_deletions(2**40, 10)
    assert list(due) == ["sh"]
    index.settle_due(due["sh"])
    index.start(sharded, keys_of(rng, 3), request("s2", 3))
    index.finish(sharded, "s2", index.session(sharded, "s2"), (), [SIZE], force_fail=True)
    assert list(index.due_deletions(2**40, 10)) == ["sh"]


class _LosesOnePipeline:
    """The cluster client, except that the next pipeline sending no script fails once (as a
    process dying right after its start scripts would leave it: the sessions written, the
    commands queued behind them never sent)."""

    def __init__(self, client):
        self._client = client
        self.armed = True

    def __getattr__(self, name):
        return getattr(self._client, name)

    def pipeline(self, *args, **kwargs):
        pipe = self._client.pipeline(*args, **kwargs)
        owner, execute = self, pipe.execute

        def failing_once(*a, **kw):
            scripted = any(cmd.args[0] == "EVALSHA" for cmd in pipe._execution_strategy.command_queue)
            if owner.armed and not scripted:
                owner.armed = False
                pipe.reset()
                raise ConnectionError("lost after the scripts")
            return execute(*a, **kw)

        pipe.execute = failing_once
        return pipe


def test_a_start_losing_its_pipeline_after_the_scripts_can_still_be_finished(index, sharded, cluster3):
    # The request positions ('o') are written by start.lua with the session, not after it.
    rng = random.Random(37)
    write(index, sharded, keys_of(rng, 9), "warm")  # storages known in every shard: no setup pipeline
    lossy = _LosesOnePipeline(cluster3)
    index.client = lossy
    keys = keys_of(rng, 12)
    with pytest.raises(Exception, match="lost after the scripts"):
        index.start(sharded, keys, request("s1", 12))
    assert not lossy.armed
    index.client = cluster3
    session = index.session(sharded, "s1")
    assert [k for k, _ in session.entries] == keys
    index.finish(sharded, "s1", session, [i % 3 != 0 for i in range(12)], [SIZE])
    served = index.read_raw(sharded, keys, MODE_BATCH)
    assert [r is not None for r in served] == [i % 3 != 0 for i in range(12)]


def test_inflated_caller_counts_are_recounted_from_the_open_sessions(index, sharded, reference, cluster3):
    # Counts an older version left too high ('p' overwritten: its finishes never counted the
    # caller down) are rebuilt per shard from the sessions still open.
    rng = random.Random(41)
    capped = {"caller": "acct", "max_caller_sessions": 50}
    spread = [k for s in range(3) for k in keys_of(rng, 3, shard=s)]
    for layout in (sharded, reference):
        index.start(layout, spread, request("open", 9, **capped))
    for shard in (*sharded.shards, reference):
        cluster3.hincrby(shard.key("sc"), "acct", 7)
        cluster3.hset(shard.key("sc"), "gone", 3)
    index.start(sharded, keys_of(rng, 3, shard=2), request("other", 3, caller="b", max_caller_sessions=50))
    assert index.recount_caller_sessions(["sh", "ref", "unknown"]) == 8  # acct and gone in each of 4 shards; b right
    assert [cluster3.hgetall(s.key("sc")) for s in sharded.shards] == [{b"acct": b"1"}] * 2 + [
        {b"acct": b"1", b"b": b"1"}
    ]
    assert cluster3.hgetall(reference.key("sc")) == {b"acct": b"1"}
    assert index.recount_caller_sessions(["sh", "ref"]) == 0


def test_a_recount_racing_starts_and_finishes_leaves_the_exact_count(index, sharded, cluster3):
    rng = random.Random(43)
    keys = [[k for s in range(3) for k in keys_of(rng, 2, shard=s)] for _ in range(40)]
    capped = {"caller": "acct", "max_caller_sessions": 1000}
    recounting, done = threading.Event(), threading.Event()

    def writer(worker):
        recounting.wait()
        for n in range(worker, len(keys), 2):
            session_id = f"w{n}"
            index.start(sharded, keys[n], request(session_id, 6, **capped))
            if n % 4:  # every fourth stays open
                index.finish(sharded, session_id, index.session(sharded, session_id), [True] * 6, [SIZE])

    def recounter():
        while not done.is_set():
            index.recount_caller_sessions(["sh"])
            recounting.set()

    threads = [threading.Thread(target=writer, args=(w,)) for w in (0, 1)]
    racer = threading.Thread(target=recounter)
    for shard in sharded.shards:
        cluster3.hset(shard.key("sc"), "acct", 100)  # inflated before the race
    racer.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    racer.join()
    assert [cluster3.hget(s.key("sc"), "acct") for s in sharded.shards] == [b"10"] * 3
    index.recount_caller_sessions(["sh"])
    assert [cluster3.hget(s.key("sc"), "acct") for s in sharded.shards] == [b"10"] * 3
