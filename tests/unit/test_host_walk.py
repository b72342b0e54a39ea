"""getHostCacheState's walk (stores/host_walk.py) against a reference that decides each
host's prefix key by key, on random slots, signatures and bitmaps: plain and Mamba prefixes,
eagle pop, the media filter, and a first part of the keys deciding the answer only when
every prefix ends inside it. Also the RESP the store sends its keys in (reporters.py)."""

from __future__ import annotations

import random
from itertools import groupby

import hiredis
import pytest

from chalicelib.resp import command
from chalicelib.stores.host_walk import HostWalk
from chalicelib.stores.reporters import HMGET_MAX_FIELDS, block_field, hmget_fields

FULL, STATE = ["full_0", "full_1"], ["linear_0"]
SIGNATURES = [
    ["gpu", "full_0", "full_1", "linear_0"],
    ["gpu", "full_0", "full_1"],
    ["gpu", "linear_0"],
    ["mem", "full_0", "full_1", "linear_0"],
    ["mem", "full_0"],
    ["gpu", "full_1"],
]


def reference(slots, bitmaps, mediums, mamba, eagle):
    """Each host's prefix decided key by key: what its set slots' spec names add up to.
    Also each host's reach: how many keys from the first it holds (Mamba: at least the
    full-attention specs of)."""
    hosts: dict[str, list[tuple[int, list[str]]]] = {}
    for host, slot, signature in slots:
        if not mediums or signature[0] in mediums:
            hosts.setdefault(host, []).append((slot, signature[1:]))

    def level(host, bitmap):
        names = set()
        for slot, spec_names in hosts[host]:
            if bitmap and slot // 8 < len(bitmap) and bitmap[slot // 8] >> (slot % 8) & 1:
                names |= set(spec_names) | {"*"}
        if not names:
            return 0
        if not mamba:
            return 2
        if not set(mamba[0]) <= names:
            return 0
        return 2 if set(mamba[1]) <= names else 1

    out, reach = {}, {}
    for host in hosts:
        levels = []
        for bitmap in bitmaps:
            held = level(host, bitmap)
            if held == 0:
                break
            levels.append(held)
        reach[host] = len(levels)
        limit = max(len(levels) - 1, 0) if eagle else len(levels)
        if mamba:
            limit = max([i + 1 for i, held in enumerate(levels[:limit]) if held == 2], default=0)
        if limit > 0:
            out[host] = limit
    return out, reach


def as_runs(bitmaps: list[bytes | None]) -> list[tuple[bytes | None, int]]:
    """The bitmaps as runs (resp.runs), here split at random too: a run may follow an equal one."""
    return [(bitmap, len(list(run))) for bitmap, run in groupby(bitmaps)]


def bitmap_of(slots: set[int]) -> bytes | None:
    if not slots:
        return None
    data = bytearray(max(slots) // 8 + 1)
    for slot in slots:
        data[slot // 8] |= 1 << (slot % 8)
    return bytes(data)


def random_case(rng: random.Random):
    hosts = [f"10.0.0.{h}:80" for h in range(rng.randint(1, 6))]
    slot_count = rng.randint(1, 24)
    slots = [(rng.choice(hosts), s, rng.choice(SIGNATURES)) for s in rng.sample(range(40), slot_count)]
    numbers = [s for _, s, _ in slots] + [rng.randrange(40, 48)]  # one slot no visible reporter owns
    held = set(rng.sample(numbers, rng.randint(0, len(numbers))))
    bitmaps = []
    for _ in range(rng.randint(1, 60)):
        if rng.random() < 0.3:  # the bitmap changes: slots dropped and added
            held ^= set(rng.sample(numbers, rng.randint(1, min(3, len(numbers)))))
        bitmaps.append(bitmap_of(held))
    return slots, bitmaps


@pytest.mark.parametrize("seed", range(300))
def test_the_walk_matches_the_reference(seed):
    rng = random.Random(seed)
    slots, bitmaps = random_case(rng)
    for mediums in ((), ("gpu",), ("mem", "gpu")):
        for mamba in (None, (FULL, STATE), (["full_0"], [])):
            for eagle in (False, True):
                walk = HostWalk(slots, mediums, mamba, eagle)
                want, reach = reference(slots, bitmaps, mediums, mamba, eagle)
                assert walk.prefixes(as_runs(bitmaps), len(bitmaps)) == want, (mediums, mamba, eagle)
                singles = [(bitmap, 1) for bitmap in bitmaps]  # runs split: the same answer
                assert walk.prefixes(singles, len(bitmaps)) == want, (mediums, mamba, eagle)
                # A first part decides when no host holds through all of it: then exactly.
                part = rng.randint(1, len(bitmaps))
                first = walk.prefixes(as_runs(bitmaps[:part]), len(bitmaps))
                undecided = part < len(bitmaps) and any(keys >= part for keys in reach.values())
                assert first == (None if undecided else want), (mediums, mamba, eagle, part)


def test_no_visible_slot_or_no_holder_of_the_first_key_is_no_host():
    assert HostWalk([]).prefixes([(b"\x01", 3)], 3) == {}
    walk = HostWalk([("a", 0, ["gpu", "full_0"])])
    assert walk.prefixes([(None, 1), (b"\x01", 1)], 5000) == {}  # decided by the first key alone
    assert walk.prefixes([(b"\x01", 2)], 3) is None  # holds the part's last key
    assert walk.prefixes([(b"\x01", 2), (b"\x02", 1)], 3) == {"a": 2}


def test_a_host_reporting_through_several_signatures_adds_up_its_spec_names():
    """Mamba: the full-attention specs in one slot, the state spec in another, both set."""
    slots = [("a", 3, ["gpu", "full_0", "full_1"]), ("a", 9, ["gpu", "linear_0"])]
    both, full_only = bitmap_of({3, 9}), bitmap_of({3})
    walk = HostWalk(slots, mamba=(FULL, STATE))
    assert walk.prefixes([(both, 2), (full_only, 2)], 4) == {"a": 2}
    assert walk.prefixes([(both, 2), (full_only, 1), (both, 1)], 4) == {"a": 4}
    eagle = HostWalk(slots, mamba=(FULL, STATE), eagle_pop=True)
    assert eagle.prefixes([(both, 2), (full_only, 1), (both, 1)], 4) == {"a": 2}
    assert HostWalk(slots, mediums=["mem"]).prefixes([(both, 1)], 1) == {}


def test_the_keys_are_hmgets_in_resp_of_at_most_3999_arguments_each():
    keys = [0, 1, -1, 2**63 - 1, -(2**63), 123456789]
    packed = hmget_fields(b"{kvcm:e1}:er:bits", keys)
    assert packed == [command(b"HMGET", b"{kvcm:e1}:er:bits", *map(block_field, keys))]
    long = list(range(2 * HMGET_MAX_FIELDS + 5))
    reader = hiredis.Reader()  # read back as a server would: arrays of bulk strings
    reader.feed(b"".join(hmget_fields(b"{kvcm:e1}:er:bits", long)))
    sent = []
    while (args := reader.gets()) is not False:
        assert args[:2] == [b"HMGET", b"{kvcm:e1}:er:bits"] and len(args) <= 3_999
        sent += args[2:]
    assert sent == [block_field(k) for k in long]
