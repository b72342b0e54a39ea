"""Valkey's protocol (RESP) as bytes, for ``valkey.exchange``'s callers: ``command`` writes
a command, ``value`` and ``runs`` read replies.

redis-py's reader (hiredis's in C) makes an object of every item of a reply: 20,000 bitmaps
of an HMGET are 20,000 ``bytes`` objects, about 1.2 ms on this project's 2-core machine,
and a walk comparing them one by one as much again. ``runs`` reads such an array as runs of
equal items instead, comparing the reply's bytes in C: a run of equal items is its first
item's bytes repeated, checked by ``startswith`` over doubling then halving stretches.
``value`` reads any other reply, small ones, as redis-py would give them.
"""

from __future__ import annotations

from typing import Any, cast

import hiredis
from redis._parsers.base import BaseParser

#: redis-py's error reply → exception mapping (NOSCRIPT → NoScriptError, MOVED → MovedError,
#: ...), so that callers catch what they would from redis-py's own reader; untyped there.
_error = cast(Any, BaseParser).parse_error


#: A transaction's first and last commands, as ``command`` writes them.
MULTI = b"*1\r\n$5\r\nMULTI\r\n"
EXEC = b"*1\r\n$4\r\nEXEC\r\n"


def command(*args: bytes | str | int) -> bytes:
    """One command in RESP, as Valkey reads it from a client."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(raw), raw))
    return b"".join(parts)


def replies(data: bytes, count: int) -> list[Any]:
    """The first ``count`` replies in ``data``, as ``value`` gives them, read by hiredis in C
    (for many small replies: a read's 131)."""
    reader = hiredis.Reader(replyError=_error)
    reader.feed(data)
    return [reader.gets() for _ in range(count)]


def _line(data: bytes, pos: int) -> tuple[bytes, int]:
    end = data.index(b"\r\n", pos)
    return data[pos:end], end + 2


def value(data: bytes, pos: int) -> tuple[Any, int]:
    """The reply at ``pos`` and the position after it: simple strings and bulk strings as
    ``bytes``, integers, arrays as lists, nulls as ``None``, error replies as redis-py's
    exception for them (``NoScriptError``, ``MovedError``, ...), not raised."""
    kind = data[pos : pos + 1]
    line, pos = _line(data, pos + 1)
    if kind == b"+":
        return line, pos
    if kind == b"_":  # RESP3's null, should a connection have said HELLO 3
        return None, pos
    if kind == b"-":
        return _error(line.decode("utf-8", "replace")), pos
    if kind == b":":
        return int(line), pos
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, pos
        return data[pos : pos + size], pos + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            item, pos = value(data, pos)
            items.append(item)
        return items, pos
    raise ValueError(f"unexpected reply type {kind!r} at byte {pos}")


_NULLS = (b"$-1\r\n", b"_\r\n")  # RESP2's null bulk string, RESP3's null


def runs(data: bytes, pos: int) -> tuple[list[tuple[bytes | None, int]], int]:
    """The array of bulk strings (or nulls) at ``pos`` as runs ``(item, how many in a
    row)`` in order, and the position after it. Equal items have equal bytes in the reply
    (``$<length>``, the bytes, CRLF), so a run is its first item's bytes repeated: it is
    measured by doubling the stretch checked, then halving it, each check one
    ``startswith`` in C; a 20,000-item array of a few dozen runs takes a few hundred."""
    line, pos = _line(data, pos + 1)
    left = int(line)
    out: list[tuple[bytes | None, int]] = []
    while left > 0:
        if data.startswith(_NULLS, pos):
            item, bitmap = _NULLS[0] if data[pos] == 36 else _NULLS[1], None  # 36: "$"
        else:
            header, start = _line(data, pos + 1)
            size = int(header)
            bitmap = data[start : start + size]
            item = data[pos : start + size + 2]
        width = len(item)
        count, step = 1, 1  # ``count`` items from ``pos`` are ``item``
        while step <= left - count and data.startswith(item * step, pos + width * count):
            count += step
            step *= 2
        while step > 1:
            step //= 2
            if step <= left - count and data.startswith(item * step, pos + width * count):
                count += step
        out.append((bitmap, count))
        pos += width * count
        left -= count
    return out, pos
