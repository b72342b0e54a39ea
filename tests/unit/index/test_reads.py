"""The read's pure part (index/reads.py): the bytes it sends, and what it answers from the
records HGET found."""

import random

import hiredis
import pytest

from chalicelib.index.layout import HEADER, LOCATION, ReadMode, Status
from chalicelib.index.reads import (
    Recency,
    answer,
    blocked_storages,
    bucket_count_of,
    bucket_names,
    read_command,
    serves,
)
from chalicelib.index.records import decode_record
from chalicelib.index.types import InstanceLayout, bucket_index
from chalicelib.resp import command

LAYOUT = InstanceLayout("t", "inst", 4)
NOW = 1_700_000_000
RECENCY = Recency(interval_s=1, decay_s=60)


def record(*locations, atime=NOW - 10, lfu=5):
    """A record with (status, storage index) locations."""
    head = HEADER.pack(0, bytes(8), 0, atime, lfu, 123, len(locations))
    return head + b"".join(
        LOCATION.pack(status, storage, 0, i + 1, 7, 0) for i, (status, storage) in enumerate(locations)
    )


SERVED = record((Status.SERVING, 1))
WRITING = record((Status.WRITING, 1))


class Coin(random.Random):
    """A coin that always lands as told (0.0: every increment happens)."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def random(self):
        return self.value


def commands(raw):
    reader = hiredis.Reader()
    reader.feed(raw)
    out = []
    while (item := reader.gets()) is not False:
        out.append(item)
    return out


def test_a_command_is_what_valkey_reads():
    assert commands(command(b"HGET", "k", 42) + command(b"PING")) == [[b"HGET", b"k", b"42"], [b"PING"]]


@pytest.mark.parametrize("with_table", [False, True])
def test_a_read_is_multi_the_count_the_table_an_hget_per_key_and_exec(with_table):
    keys = [5, -3, 1 << 40]
    names = bucket_names(LAYOUT, keys, 12)
    assert names == [LAYOUT.bucket(bucket_index(k, 12)) for k in keys]
    fields = [k.to_bytes(8, "big", signed=True) for k in keys]
    sent = commands(read_command(LAYOUT, names, fields, with_table, tail=command(b"XADD", b"s", b"*", b"a", b"1")))
    table = [[b"HGETALL", LAYOUT.key("st")]] if with_table else []
    assert sent == [
        [b"MULTI"],
        [b"HMGET", LAYOUT.key("m"), b"n", b"bits"],
        *table,
        *([b"HGET", name, field] for name, field in zip(names, fields, strict=True)),
        [b"EXEC"],
        [b"XADD", b"s", b"*", b"a", b"1"],
    ]


def test_the_bucket_count_is_n_else_two_to_the_registered_bits():
    assert bucket_count_of([b"24", b"4"]) == 24
    assert bucket_count_of([None, b"4"]) == 16
    assert bucket_count_of([None, None]) == 1


def test_blocked_storages_from_a_resp3_map_or_a_resp2_list():
    table = {b"#1": b"nfs_01", b"#2": b"s3_01", b"nfs_01": b"1", b"next": b"3"}
    assert blocked_storages(table, ["nfs_01"]) == {2}
    assert blocked_storages([x for pair in table.items() for x in pair], ["nfs_01"]) == {2}
    assert blocked_storages(table, []) == {1, 2}


def test_a_record_serves_through_any_serving_location_on_a_storage_that_may_serve():
    two = record((Status.WRITING, 1), (Status.SERVING, 2))
    assert serves(two, frozenset()) and serves(SERVED, frozenset())
    assert not serves(two, frozenset({2})) and serves(two, frozenset({1}))
    assert not serves(WRITING, frozenset()) and not serves(SERVED, frozenset({1}))


def test_the_lfu_counter_decays_per_period_then_may_gain_one():
    old = record((Status.SERVING, 1), atime=NOW - 180, lfu=10)
    assert RECENCY.counter(old, NOW, Coin(0.0)) == 8  # 10 - 3 periods, then + 1
    assert RECENCY.counter(old, NOW, Coin(0.99)) == 7
    assert Recency(1, 0).counter(old, NOW, Coin(0.99)) == 10  # no decay
    assert RECENCY.counter(record((Status.SERVING, 1), atime=NOW, lfu=255), NOW, Coin(0.0)) == 255
    # 1 / (10 × (counter − 5) + 1): at 7 an access counts one time in 21
    at7 = record((Status.SERVING, 1), atime=NOW, lfu=7)
    assert RECENCY.counter(at7, NOW, Coin(1 / 21 - 1e-9)) == 8 and RECENCY.counter(at7, NOW, Coin(1 / 21)) == 7


def test_each_mode_answers_its_records_and_refreshes_only_what_it_serves():
    found = [SERVED, WRITING, None, SERVED, SERVED]
    raw = answer(found, ReadMode.RAW, 0, frozenset(), None, NOW, RECENCY, Coin(0.0))
    assert raw.records == found and raw.due == []
    prefix = answer(found, ReadMode.PREFIX, 0, frozenset(), None, NOW, RECENCY, Coin(0.0))
    assert len(prefix.records) == 1 and prefix.due == [0]
    covered = answer(found, ReadMode.PREFIX, 0, frozenset(), [False, True, True, False, False], NOW, RECENCY, Coin(0.0))
    assert [r is not None for r in covered.records] == [True, False, False, True, True]
    assert covered.due == [0, 3, 4]
    batch = answer(found, ReadMode.BATCH, 0, frozenset(), None, NOW, RECENCY, Coin(0.0))
    assert [r is not None for r in batch.records] == [True, False, False, True, True]
    window = answer(found, ReadMode.WINDOW, 2, frozenset(), None, NOW, RECENCY, Coin(0.0))
    assert [r is not None for r in window.records] == [False, False, False, True, True] and window.due == [3, 4]


def test_a_refreshed_record_differs_only_in_access_time_and_counter():
    fresh = record((Status.SERVING, 1), atime=NOW)
    out = answer([SERVED, fresh], ReadMode.BATCH, 0, frozenset(), None, NOW, RECENCY, Coin(0.0))
    assert out.due == [0] and bytes(out.lfu) == bytes([6])
    assert out.records[1] is fresh  # within the interval: untouched
    before, after = decode_record(SERVED), decode_record(out.records[0])
    assert (after.last_access_s, after.lfu) == (NOW, 6)
    assert (after.locations, after.write_time_ms, after.parent) == (
        before.locations,
        before.write_time_ms,
        before.parent,
    )
