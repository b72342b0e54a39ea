"""Valkey replies read from their bytes (chalicelib/resp.py) against hiredis's reader, which
redis-py uses: arrays of bitmaps as runs of equal items, whatever their lengths and runs,
and the other replies as redis-py gives them (errors as its exceptions)."""

from __future__ import annotations

import random

import hiredis
import pytest
from redis.exceptions import MovedError, NoScriptError, ResponseError

from chalicelib import resp


def bulk(item: bytes | None) -> bytes:
    return b"$-1\r\n" if item is None else b"$%d\r\n%s\r\n" % (len(item), item)


def array(items: list[bytes | None]) -> bytes:
    return b"*%d\r\n" % len(items) + b"".join(map(bulk, items))


def runs_of(items: list[bytes | None]) -> list[tuple[bytes | None, int]]:
    out: list[tuple[bytes | None, int]] = []
    for item in items:
        if out and out[-1][0] == item:
            out[-1] = (item, out[-1][1] + 1)
        else:
            out.append((item, 1))
    return out


@pytest.mark.parametrize("seed", range(200))
def test_an_array_reads_as_its_runs(seed):
    rng = random.Random(seed)
    # Few distinct values, some a prefix or a repetition of another (b"\x01" and b"\x01\x01"),
    # in runs of any length: what the bytes of one run could be confused with.
    values = [None, b"", b"\x01", b"\x01\x01", b"\r\n", b"$1\r\n\x01\r\n", bytes(rng.randrange(256) for _ in range(9))]
    items: list[bytes | None] = []
    for _ in range(rng.randint(0, 40)):
        items += [rng.choice(values)] * rng.choice([1, 1, 2, 3, 7, 64, 1000])
    data = b"+OK\r\n" + array(items) + b"+after\r\n"
    got, pos = resp.runs(data, 5)
    assert got == runs_of(items)
    assert data[pos:] == b"+after\r\n"
    reader = hiredis.Reader()
    reader.feed(array(items))
    assert [item for item, count in got for _ in range(count)] == reader.gets()


def test_a_resp3_null_is_a_null():
    assert resp.runs(b"*3\r\n_\r\n_\r\n$1\r\na\r\n", 0) == ([(None, 2), (b"a", 1)], 17)
    assert resp.value(b"_\r\n", 0) == (None, 3)


def test_other_replies_read_as_redis_py_gives_them():
    data = (
        b"+OK\r\n+QUEUED\r\n-NOSCRIPT No matching script.\r\n-MOVED 12 127.0.0.1:7001\r\n"
        b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
        b"*3\r\n$3\r\nabc\r\n:-42\r\n*2\r\n$-1\r\n*-1\r\n$0\r\n\r\n"
    )
    pos, got = 0, []
    while pos < len(data):
        reply, pos = resp.value(data, pos)
        got.append(reply)
    assert got[:2] == [b"OK", b"QUEUED"]
    assert isinstance(got[2], NoScriptError)
    assert isinstance(got[3], MovedError) and got[3].slot_id == 12 and got[3].port == 7001
    assert type(got[4]) is ResponseError and str(got[4]).startswith("WRONGTYPE")
    assert got[5:] == [[b"abc", -42, [None, None]], b""]
