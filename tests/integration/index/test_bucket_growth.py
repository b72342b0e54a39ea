"""Buckets grow with an instance's records (issue 23 item 10): linear hashing, a split at a
time inside the start that passes the load factor, on a real Valkey."""

from __future__ import annotations

import random
import threading

import pytest

from chalicelib.index import BlockIndex
from chalicelib.index.layout import MAX_BUCKETS, MAX_SPLITS_PER_CALL, lua_constants
from chalicelib.index.scripts import LUA_DIR
from chalicelib.index.types import MODE_BATCH, MODE_PREFIX, MODE_RAW, StartRequest, bucket_index
from tests.helpers import valkey_cluster

SIZE = 100
#: A small load factor: many splits from few records.
PER_BUCKET = 4


@pytest.fixture
def index(index):
    """The shared block index with few records per bucket."""
    index.RECORDS_PER_BUCKET = PER_BUCKET
    return index


def write(index, layout, keys, sid):
    """Start + finish of ``keys`` (a prefix chain), every block a success."""
    index.start(
        layout,
        keys,
        StartRequest(sid, int(index.clock.now() * 1000) + 60_000, "nfs", "ST_NFS", 0, [SIZE], [0] * len(keys)),
    )
    session = index.session(layout, sid)
    if session is not None:
        index.finish(layout, sid, session, [True] * len(session.entries), [SIZE])


def stored(valkey, layout) -> dict[int, set[int]]:
    """Bucket number -> the block keys its hash holds, read from Valkey itself."""
    out: dict[int, set[int]] = {}
    for shard_no, shard in enumerate(layout.shards):
        for name in valkey.scan_iter(match=shard.bucket_prefix + b"*", count=1000):
            number = int(name[len(shard.bucket_prefix) :], 16) | (shard_no << 24 if layout.shard_suffixes else 0)
            out[number] = {int.from_bytes(f, "big", signed=True) for f in valkey.hkeys(name)}
    return out


def occupied(valkey, layout) -> set[int]:
    return {
        int(m) | (s << 24 if layout.shard_suffixes else 0)
        for s, shard in enumerate(layout.shards)
        for m in valkey.smembers(shard.occupied)
    }


def check_addressing(index, valkey, layout, keys) -> None:
    """Every key is in exactly the bucket its shard's count addresses, nowhere else; the
    occupied set is the set of buckets that exist; each is read back."""
    buckets = stored(valkey, layout)
    where = {k: b for b, held in buckets.items() for k in held}
    assert sum(len(held) for held in buckets.values()) == len(where) == len(set(keys))
    for key in keys:
        shard_no = (key >> 40) % layout.shard_count
        count = index.bucket_count(layout.shards[shard_no])
        expected = bucket_index(key, count) | (shard_no << 24 if layout.shard_suffixes else 0)
        assert where[key] == expected
    assert occupied(valkey, layout) == set(buckets)
    assert all(index.read_raw(layout, list(keys), MODE_RAW))


def test_python_and_lua_address_a_key_alike(valkey):
    """``bucket_index`` mirrors the prelude's for every level, split pointer and key sign."""
    source = lua_constants() + (LUA_DIR / "prelude.lua").read_text()
    script = valkey.register_script(
        source + "local out = {} for i = 1, #ARGV[1] / 8 do out[i] = bucket_index(tonumber(ARGV[2]), "
        "string.sub(ARGV[1], i * 8 - 7, i * 8)) end return out"
    )
    rng = random.Random(3)
    keys = [rng.getrandbits(64) - (1 << 63) for _ in range(300)] + [0, -1, 11, (1 << 63) - 1]
    blob = b"".join(k.to_bytes(8, "big", signed=True) for k in keys)
    for count in (1, 16, 17, 23, 31, 32, 100, 4095, 4096, 70_001, MAX_BUCKETS - 1, MAX_BUCKETS):
        assert script(args=[blob, count]) == [bucket_index(k, count) for k in keys], count


def test_buckets_grow_with_the_records_and_every_key_stays_found(index, valkey):
    """A new key space has 16 buckets whatever its quota; each start splits as its records
    pass PER_BUCKET per bucket, and every key is in the bucket its count addresses, its
    parent's child count intact."""
    layout = index.claim("grow", "inc-1", 4, registering=True)
    assert index.bucket_count(layout) == 16
    rng = random.Random(5)
    written: list[int] = []
    for n in range(40):
        chain = [rng.getrandbits(63) for _ in range(16)]
        write(index, layout, chain, f"s{n}")
        written += chain
        assert index.bucket_count(layout) == max(16, -(-len(written) // PER_BUCKET))
    assert index.bucket_count(layout) == 160
    check_addressing(index, valkey, layout, written)
    records = index.read(layout, written, MODE_PREFIX)
    assert len(records) == len(written)
    assert [r.children for r in records[:16]] == [1] * 15 + [0]


def test_a_read_with_a_count_from_before_a_split_finds_every_key(index, valkey, clock):
    """Another container's start split the buckets after this one last read: the read finds
    every key (the script names the buckets) and brings the count up to date."""
    layout = index.layout("two", 4)
    other = BlockIndex(valkey, "t", clock)
    other.RECORDS_PER_BUCKET = PER_BUCKET
    rng = random.Random(1)
    first = [rng.getrandbits(63) for _ in range(8)]
    write(index, layout, first, "s0")
    assert len(index.read_raw(layout, first, MODE_PREFIX)) == 8
    more = [rng.getrandbits(63) for _ in range(200)]
    for n in range(0, 200, 20):
        write(other, layout, more[n : n + 20], f"t{n}")
    assert other.bucket_count(layout) == 52
    assert len(index.read_raw(layout, first + more, MODE_BATCH)) == 208
    assert all(index.read_raw(layout, first + more, MODE_BATCH))
    assert index._bucket_counts[layout.tag] == 52


def test_a_key_space_registered_with_fixed_buckets_keeps_them_as_its_first_level(index, valkey):
    """An instance registered before buckets grew (meta 'bits' = 6, no 'n'; its keys in
    ``key mod 64``) keeps working: its records are found where they are, and starts grow
    its buckets from 64."""
    layout = index.layout("old", 6)
    valkey.hset(layout.key("m"), mapping={"bits": 6, "ob": 1})
    rng = random.Random(7)
    old = [rng.getrandbits(63) for _ in range(2000)]
    index.RECORDS_PER_BUCKET = 64  # 2,000 records in 64 buckets: no split at 64 per bucket
    for n in range(0, 2000, 100):
        write(index, layout, old[n : n + 100], f"s{n}")
    assert valkey.hget(layout.key("m"), "n") is None
    assert {k: b for b, held in stored(valkey, layout).items() for k in held} == {k: k & 63 for k in old}
    index.RECORDS_PER_BUCKET = PER_BUCKET
    new = [rng.getrandbits(63) for _ in range(20)]
    write(index, layout, new, "t0")
    # 2,020 records want 505 buckets: each start catches up by a bounded step.
    assert index.bucket_count(layout) == 64 + MAX_SPLITS_PER_CALL
    check_addressing(index, valkey, layout, old + new)
    for n in range(4):
        key = rng.getrandbits(63)
        write(index, layout, [key], f"t{n + 1}")
        new.append(key)
    assert index.bucket_count(layout) == -(-(len(old) + len(new)) // PER_BUCKET) == 506
    check_addressing(index, valkey, layout, old + new)


def test_marks_restores_drops_and_forgets_address_split_buckets(index, valkey):
    """Every script finds records moved by a split; dropping all of them leaves no bucket,
    an empty occupied set and zero usage."""
    layout = index.layout("ops", 4)
    rng = random.Random(9)
    keys = [rng.getrandbits(63) for _ in range(300)]
    for n in range(0, 300, 30):
        write(index, layout, keys[n : n + 30], f"s{n}")
    assert index.bucket_count(layout) == 75
    first = index.mark_deleting(layout, keys[:100], [SIZE])
    assert len(first) == 100
    assert index.restore(layout, first[:40], [SIZE]) == 40
    again = index.mark_deleting(layout, keys[:40], [SIZE])
    assert len(again) == 40
    forgotten = keys[100:150]
    ids = [r.locations[0].location_id for r in index.read(layout, forgotten, MODE_RAW)]
    assert index.forget(layout, forgotten, ids) == 50
    assert index.drop(layout, first[40:] + again, [SIZE]).dropped == 100
    check_addressing(index, valkey, layout, keys[150:])
    rest = index.mark_deleting(layout, keys[150:], [SIZE])
    assert index.drop(layout, rest, [SIZE]).dropped == 150
    usage = index.usage([layout])[0]
    assert (usage.keys, usage.deleting_keys, usage.bytes - 50 * SIZE) == (0, 0, 0)
    assert stored(valkey, layout) == {} and occupied(valkey, layout) == set()


def test_a_sharded_instance_grows_each_shard_by_its_own_records(index, valkey):
    """Each shard splits by its own count; reads, samples and scans cover the moved records."""
    layout = index.claim("sh", "inc-1", 4, registering=True, shard_count=3)
    rng = random.Random(11)
    keys = [rng.getrandbits(63) for _ in range(600)]
    for n in range(0, 600, 25):
        write(index, layout, keys[n : n + 25], f"s{n}")
    per_shard = [sum(1 for k in keys if (k >> 40) % 3 == s) for s in range(3)]
    assert [index.bucket_count(shard) for shard in layout.shards] == [max(16, -(-c // PER_BUCKET)) for c in per_shard]
    check_addressing(index, valkey, layout, keys)
    assert sorted(k for k, _ in index.scan(layout, page=7)) == sorted(keys)
    total, sample = index.occupied_sample(layout, 10)
    assert total == len(stored(valkey, layout)) and len(sample) == 10
    assert all(index.read_buckets(layout, [b]) for b in sample)


def test_a_registration_over_an_emptied_key_space_starts_its_buckets_again(index, valkey):
    layout = index.claim("again", "inc-1", 4, registering=True)
    rng = random.Random(13)
    write(index, layout, [rng.getrandbits(63) for _ in range(100)], "s0")
    assert index.bucket_count(layout) == 25
    index.drop_all(layout)
    again = index.claim("again", "inc-2", 4, registering=True)
    assert index.bucket_count(again) == 16
    keys = [rng.getrandbits(63) for _ in range(10)]
    write(index, again, keys, "s1")
    check_addressing(index, valkey, again, keys)


def test_reads_across_splits_on_a_cluster(tmp_path, clock):
    """On a cluster-mode Valkey, a read whose bucket names are out of date still finds every
    key: the buckets it names itself share the instance's slot."""
    with valkey_cluster(tmp_path, 1) as cluster:
        writer, reader = BlockIndex(cluster, "kvcm", clock), BlockIndex(cluster, "kvcm", clock)
        writer.RECORDS_PER_BUCKET = PER_BUCKET
        layout = writer.layout("inst", 4)
        rng = random.Random(17)
        keys = [rng.getrandbits(63) for _ in range(120)]
        write(writer, layout, keys[:4], "s0")
        assert len(reader.read_raw(layout, keys[:4], MODE_PREFIX)) == 4
        for n in range(4, 120, 29):
            write(writer, layout, keys[n : n + 29], f"s{n}")
        assert len(reader.read_raw(layout, keys, MODE_PREFIX)) == 120


def test_concurrent_writes_reads_and_removals_across_splits_lose_and_duplicate_nothing(valkey_url, clock):
    """Threads write, read and remove blocks while buckets split: a block finished and not
    removed is always found, no key is in two buckets, and usage counts exactly what is
    stored."""
    import redis

    client = redis.Redis.from_url(valkey_url)
    client.flushall()
    index = BlockIndex(client, "t", clock)
    index.RECORDS_PER_BUCKET = PER_BUCKET
    layout = index.layout("hammer", 4)
    lock = threading.Lock()
    served: set[int] = set()
    removed: set[int] = set()
    misses: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                done.set()

        return run

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        for n in range(60):
            chain = [rng.getrandbits(63) for _ in range(rng.randint(1, 24))]
            write(index, layout, chain, f"w{seed}-{n}")
            with lock:
                served.update(chain)

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not done.is_set():
            with lock:
                before = set(rng.sample(sorted(served), min(64, len(served))))
            if not before:
                done.wait(0.001)
                continue
            keys = sorted(before)
            found = index.read_raw(layout, keys, MODE_BATCH)
            with lock:
                misses.extend(k for k, raw in zip(keys, found, strict=True) if raw is None and k in served)

    def remover() -> None:
        rng = random.Random(99)
        while not done.is_set():
            with lock:
                picked = rng.sample(sorted(served), 10) if len(served) >= 50 else []
                served.difference_update(picked)
                removed.update(picked)
            if not picked:
                done.wait(0.001)
                continue
            victims = index.mark_deleting(layout, picked, [SIZE])
            index.drop(layout, victims, [SIZE])

    writers = [threading.Thread(target=guarded(lambda s=s: writer(s))) for s in range(4)]
    others = [threading.Thread(target=guarded(lambda s=s: reader(s))) for s in (100, 101)]
    others.append(threading.Thread(target=guarded(remover)))
    for t in writers + others:
        t.start()
    for t in writers:
        t.join()
    done.set()
    for t in others:
        t.join()
    assert not errors, errors
    assert misses == []
    buckets = stored(client, layout)
    held = [k for keys in buckets.values() for k in keys]
    assert len(held) == len(set(held)) == len(served)
    assert set(held) == served and not (set(held) & removed)
    assert index.bucket_count(layout) >= -(-len(served) // PER_BUCKET)
    usage = index.usage([layout])[0]
    assert (usage.keys, usage.bytes, usage.deleting_keys) == (len(served), len(served) * SIZE, 0)
    check_addressing(index, client, layout, sorted(served))
