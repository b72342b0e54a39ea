"""The memory-pool allocator on a real Valkey: placement, reuse, atomicity, ownership, capacity."""

import itertools
import random
import threading

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from chalicelib.protocol.codes import ErrorCode
from chalicelib.protocol.errors import ServiceNotReadyError, status_of
from chalicelib.storage import BlockRef, PoolExhaustedError, SpecSlot, StorageError, TairMemPoolBackend

from .harness import storage_config

SPECS = (SpecSlot("tp0", 0, 60), SpecSlot("tp1", 60, 40))  # 100-byte blocks


def pool(valkey, capacity=1000, name="pool_01", domain="127.0.0.1:1"):
    return TairMemPoolBackend(storage_config(name, "tair_mem_pool", {"domain": domain, "capacity": capacity}), valkey)


def place(backend, count, size=100, instance="inst", first_location=1):
    """Reserve and bind like startWriteCache does; returns the BlockRefs."""
    specs = SPECS if size == 100 else (SpecSlot("all", 0, size),)
    groups = backend.reserve(instance, count, size)
    blocks = [BlockRef(instance, i, first_location + i, g, 0, specs) for i, g in enumerate(groups)]
    backend.prepare(blocks)
    return blocks


def check_invariants(backend):
    """Ranges are disjoint, free ranges are maximal, and the books balance."""
    snap = backend.snapshot()
    ranges = sorted([(s, n, "free") for s, n in snap.free] + [(s, n, "used") for s, n in snap.used])
    for (s1, n1, k1), (s2, _, k2) in itertools.pairwise(ranges):
        assert s1 + n1 <= s2, f"overlap: {(s1, n1, k1)} and {s2}"
        assert not (k1 == k2 == "free" and s1 + n1 == s2), "touching free ranges were not merged"
    assert all(n > 0 for _, n, _ in ranges)
    assert snap.free_bytes == sum(n for _, n in snap.free)
    assert snap.used_bytes == sum(n for _, n in snap.used)
    assert snap.free_bytes + snap.used_bytes == snap.capacity == backend.capacity
    return snap


def test_uri_points_at_address_plus_spec_offset(valkey):
    backend = pool(valkey)
    blocks = place(backend, 2)
    assert [b.group_id for b in blocks] == [0, 100]
    assert backend.uri(blocks[1], SPECS[1]) == "pace://pool_01/160?size=40"


def test_freed_ranges_are_reused_and_merged(valkey):
    backend = pool(valkey)
    blocks = place(backend, 10)
    backend.delete([blocks[3]])
    again = place(backend, 1, first_location=50)
    assert again[0].group_id == 300, "best fit takes the exact hole"
    backend.delete(blocks[:3] + again + blocks[4:])
    snap = check_invariants(backend)
    assert snap.free == [(0, 1000)] and snap.used == []


def test_best_fit_prefers_the_smallest_hole(valkey):
    backend = pool(valkey, capacity=1000)
    blocks = place(backend, 10)
    backend.delete([blocks[1]])  # hole of 100 at 100
    backend.delete(blocks[5:8])  # hole of 300 at 500
    assert backend.reserve("inst", 1, 90) == [100]
    assert backend.reserve("inst", 2, 150) == [500, 650]
    check_invariants(backend)


def test_exhaustion_is_typed_and_leaves_nothing_allocated(valkey):
    backend = pool(valkey)
    place(backend, 9)
    before = backend.snapshot()
    with pytest.raises(PoolExhaustedError) as info:
        backend.reserve("inst", 2, 100)
    assert status_of(info.value)[0] is ErrorCode.REACH_MAX_ENTITY_CAPACITY
    assert "100 of 1000 bytes free" in str(info.value)
    assert backend.snapshot() == before


def test_fragmented_pool_rolls_back_a_partial_reservation(valkey):
    backend = pool(valkey)
    blocks = place(backend, 20, size=50)
    # Holes of 100 at 0 and 200, of 50 at 400 and 600: 300 bytes free.
    backend.delete([blocks[i] for i in (0, 1, 4, 5, 8, 12)])
    before = check_invariants(backend)
    assert before.free == [(0, 100), (200, 100), (400, 50), (600, 50)]
    with pytest.raises(PoolExhaustedError, match="largest free range 100"):
        backend.reserve("inst", 3, 100)  # two blocks fit, the third does not: all undone
    assert check_invariants(backend) == before
    with pytest.raises(PoolExhaustedError):
        backend.reserve("inst", 2, 150)  # enough bytes, no hole that fits
    assert check_invariants(backend) == before


def test_unreserve_frees_only_unbound_reservations_of_the_instance(valkey):
    backend = pool(valkey)
    bound = place(backend, 2)
    spare = backend.reserve("inst", 2, 100)
    theirs = backend.reserve("other", 1, 100)
    backend.unreserve("inst", [b.group_id for b in bound] + spare + theirs, 100)
    snap = check_invariants(backend)
    assert snap.used == [(0, 100), (100, 100), (400, 100)] and snap.unbound == 1


def test_delete_is_idempotent_and_never_frees_a_reused_range(valkey):
    backend = pool(valkey)
    (block,) = place(backend, 1, first_location=7)
    backend.delete([block])
    backend.delete([block])
    assert not backend.exists(block)
    (successor,) = place(backend, 1, first_location=8)
    assert successor.group_id == block.group_id
    backend.delete([block])  # a late retry of the first deletion
    assert backend.exists(successor) and not backend.exists(block)
    other_instance = BlockRef("other", 0, 8, successor.group_id, 0, SPECS)
    backend.delete([other_instance])  # same location id, different instance
    assert backend.exists(successor)
    check_invariants(backend)


def test_unbound_reservations_are_swept_after_their_ttl(valkey):
    backend = pool(valkey)
    (address,) = backend.reserve("inst", 1, 100)  # the request died before prepare
    orphan = BlockRef("inst", 0, 9, address, 0, SPECS)
    backend.delete([orphan])  # never bound to this block: nothing happens
    assert backend.snapshot().used == [(0, 100)] and backend.snapshot().unbound == 1
    impatient = TairMemPoolBackend(backend.config, valkey, reservation_ttl_s=0)
    assert impatient.reserve("other", 1, 300) == [0], "the orphan was swept first"
    with pytest.raises(StorageError, match="1 reservation"):
        backend.prepare([orphan])  # too late: its range went to someone else
    snap = check_invariants(backend)
    assert snap.used == [(0, 300)] and snap.unbound == 1


def test_pools_are_independent(valkey):
    one, two = pool(valkey, name="p1"), pool(valkey, name="p2")
    assert place(one, 3)[0].group_id == place(two, 3)[0].group_id == 0
    assert one.snapshot().used_bytes == two.snapshot().used_bytes == 300


def test_capacity_shrink_and_grow(valkey):
    big = pool(valkey, capacity=1000)
    blocks = place(big, 8)  # [0, 800) used
    big.delete([blocks[1]])
    small = pool(valkey, capacity=500)
    with pytest.raises(PoolExhaustedError):
        small.reserve("inst", 1, 200)
    snap = small.snapshot()
    assert snap.capacity == 500 and snap.free == [(100, 100)]
    small.delete([blocks[6]])  # [600, 700) lies past the new end: dropped, not freed
    assert small.snapshot().free == [(100, 100)]
    grown = pool(valkey, capacity=1200)
    grown.reserve("inst", 1, 1)  # any call applies the new capacity
    snap = grown.snapshot()
    assert snap.free == [(101, 99), (600, 100), (800, 400)]
    assert snap.used == [(0, 100), (100, 1), (200, 100), (300, 100), (400, 100), (500, 100), (700, 100)]
    check_invariants(grown)


def test_large_addresses_stay_exact(valkey):
    capacity = 1 << 48
    backend = pool(valkey, capacity=capacity)
    first = backend.reserve("inst", 1, capacity - 3)
    assert first == [0]
    assert backend.reserve("inst", 3, 1) == [capacity - 3, capacity - 2, capacity - 1]
    check_invariants(backend)


def test_valkey_down_is_service_not_ready():
    backend = pool(redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0)))
    with pytest.raises(ServiceNotReadyError, match="allocator unreachable"):
        backend.reserve("inst", 1, 100)


def test_concurrent_random_reserve_and_free(valkey):
    """Several threads, each with its own backend (like Lambda containers), share one pool."""
    capacity = 64 * 1024
    sizes = [64, 100, 256, 1000, 4096]
    held: dict[int, list[BlockRef]] = {}
    errors: list[BaseException] = []

    def worker(seed):
        rng = random.Random(seed)
        backend = pool(valkey, capacity=capacity)
        mine = held.setdefault(seed, [])
        location = seed * 1_000_000
        try:
            for _ in range(150):
                if mine and rng.random() < 0.45:
                    victims = rng.sample(mine, rng.randint(1, min(3, len(mine))))
                    backend.delete(victims)
                    if rng.random() < 0.2:
                        backend.delete(victims)  # a retry
                    for victim in victims:
                        mine.remove(victim)
                else:
                    size = rng.choice(sizes)
                    try:
                        blocks = place(backend, rng.randint(1, 4), size, instance=f"i{seed}", first_location=location)
                    except PoolExhaustedError:
                        continue
                    location += 10
                    mine.extend(blocks)
                    if rng.random() < 0.2:  # a key turned out to exist: its reservation goes back
                        try:
                            spare = backend.reserve(f"i{seed}", 1, size)
                        except PoolExhaustedError:
                            continue
                        backend.unreserve(f"i{seed}", spare, size)
        except BaseException as exc:  # noqa: BLE001 - surfaced to the test below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    backend = pool(valkey, capacity=capacity)
    snap = check_invariants(backend)
    expected = sorted((b.group_id, b.specs[-1].offset + b.specs[-1].size) for blocks in held.values() for b in blocks)
    assert snap.used == expected, "exactly the live blocks are allocated"
    assert all(backend.exists(b) for blocks in held.values() for b in blocks)
    backend.delete([b for blocks in held.values() for b in blocks])
    assert check_invariants(backend).free == [(0, capacity)]
