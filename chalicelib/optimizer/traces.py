"""Trace readers: every supported format becomes one stream of :class:`Record`.

A record is one cache operation of one instance at one time:

* ``Op.READ``    -- a lookup (KVCM ``getCacheLocation``): count hits, never insert.
* ``Op.WRITE``   -- blocks that became stored (KVCM ``finishWriteCache``); a mask marks
  keys of the list that were *not* written (kept so every key keeps its parent).
* ``Op.REQUEST`` -- the combined read+write model of request-level traces (Mooncake,
  Qwen-Bailian, upstream ``type: request``): a lookup of the keys, then a write of the
  same keys.

Readers stream: they hold one line at a time (the KVCM event-log reader also holds the
write sessions that are still open). Malformed input raises :class:`TraceFormatError`
naming the file and the 1-based line number.

Supported formats (``FORMATS``):

``mooncake``      Mooncake JSONL: ``timestamp`` (ms), ``hash_ids``, optional ``input_length``.
``qwen_bailian``  Qwen-Bailian JSONL: ``chat_id``, ``parent_chat_id``, ``timestamp`` (s),
                  ``input_length``, ``hash_ids``, ``turn``, ``type``.
``kvcm_events``   the KVCM event log (see shared/design/API.md, "Events").
``upstream``      the upstream optimizer schema JSONL: ``instance_id``, ``timestamp_us`` (or
                  ``timestamp_ns``), ``keys`` or ``tokens``, ``query_type``, ``block_mask``,
                  optional ``type`` (get/write/request) and ``input_len``.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from pathlib import Path
from typing import Any, NamedTuple

from chalicelib.optimizer.errors import ConfigError, TraceFormatError
from chalicelib.protocol.block_keys import keys_from_tokens

PathLike = str | Path

INT64_MAX = (1 << 63) - 1
DEFAULT_INSTANCE = "default"
#: A StartWriteCache that is never finished counts as written this long after its start.
UNFINISHED_WRITE_DELAY_US = 100_000


class Op(IntFlag):
    """What a record does to the cache; ``REQUEST`` is ``READ | WRITE`` of the same keys."""

    READ = 1
    WRITE = 2
    REQUEST = 3


class Query(IntEnum):
    """Read semantics, as in KVCM ``getCacheLocation``."""

    PREFIX_MATCH = 0
    BATCH_GET = 1
    REVERSE_ROLL_SW_MATCH = 2


class Record(NamedTuple):
    """One operation of the internal request stream.

    ``mask`` marks blocks the engine already holds locally (internal hits): an int ``n``
    masks indices ``< n``, a tuple of bools masks where true. ``input_tokens`` is the
    request's prompt length when the trace gives it (0 = unknown: blocks x block size).
    """

    instance: str
    timestamp_us: int
    op: Op
    keys: Sequence[int]
    mask: int | tuple[bool, ...] = 0
    input_tokens: int = 0
    query: Query = Query.PREFIX_MATCH
    sw_size: int = 0


def block_keys_from_tokens(tokens: Sequence[int], block_size: int) -> list[int]:
    """Derive KVCM block keys from token ids (RTP-LLM rolling hash, bit-exact with upstream).

    The hash is not reset between blocks, so a key depends on its whole prefix; a trailing
    partial block gets no key.
    """
    if block_size <= 0:
        raise ConfigError(f"block size must be positive, got {block_size}")
    return keys_from_tokens(tokens, block_size)


# ---------------------------------------------------------------------------- helpers


class _Line:
    """Field accessors for one parsed JSON line that raise errors naming the line."""

    __slots__ = ("obj", "lineno", "path")

    def __init__(self, obj: dict[str, Any], lineno: int, path: str) -> None:
        self.obj = obj
        self.lineno = lineno
        self.path = path

    def error(self, message: str) -> TraceFormatError:
        return TraceFormatError(message, line=self.lineno, path=self.path)

    def has(self, name: str) -> bool:
        return name in self.obj

    def integer(self, name: str, default: int | None = None) -> int:
        value = self.obj.get(name, default)
        if value is None:
            raise self.error(f"missing field {name!r}")
        if type(value) is not int:
            raise self.error(f"field {name!r} must be an integer, got {value!r}")
        return value

    def number(self, name: str) -> float | int:
        value = self.obj.get(name)
        if value is None:
            raise self.error(f"missing field {name!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(f"field {name!r} must be a number, got {value!r}")
        return value

    def text(self, name: str, default: str | None = None) -> str:
        value = self.obj.get(name, default)
        if value is None:
            raise self.error(f"missing field {name!r}")
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise self.error(f"field {name!r} must be a string, got {value!r}")
        return str(value)

    def integers(self, name: str, *, required: bool = True) -> list[int]:
        value = self.obj.get(name)
        if value is None:
            if required:
                raise self.error(f"missing field {name!r}")
            return []
        if not isinstance(value, list) or not all(type(v) is int for v in value):
            raise self.error(f"field {name!r} must be a list of integers")
        if value and (max(value) > INT64_MAX):
            # upstream maps unsigned 64-bit keys onto int64 by two's complement
            value = [v - (1 << 64) if v > INT64_MAX else v for v in value]
        return value

    def mask(self, name: str) -> int | tuple[bool, ...]:
        return _normalize_mask(self.obj.get(name), self)

    def query(self) -> Query:
        value = self.obj.get("query_type", "prefix_match")
        query = _QUERY_NAMES.get(str(value).lower())
        if query is None:
            raise self.error(f"unknown query_type {value!r}")
        return query


_QUERY_NAMES = {
    **{name: Query.PREFIX_MATCH for name in ("prefix_match", "qt_prefix_match", "2", "")},
    **{name: Query.BATCH_GET for name in ("batch_get", "qt_batch_get", "1")},
    **{name: Query.REVERSE_ROLL_SW_MATCH for name in ("reverse_roll_sw_match", "qt_reverse_roll_sw_match", "3")},
}


def _normalize_mask(value: Any, line: _Line) -> int | tuple[bool, ...]:
    """Accept an int offset, a bool list, or proto3-JSON ``{offset}`` / ``{bool_masks: {values}}``."""
    if isinstance(value, dict):
        if "offset" in value:
            value = value["offset"]
        else:
            value = (value.get("bool_masks") or value.get("boolMasks") or {}).get("values", [])
    if value is None:
        return 0
    if type(value) is int:
        if value < 0:
            raise line.error(f"block mask offset must be >= 0, got {value}")
        return value
    if isinstance(value, list) and all(type(v) is bool for v in value):
        masked = tuple(value)
        offset = masked.index(False) if False in masked else len(masked)
        # a run of leading trues is an offset: the replay has a fast path for that
        return offset if True not in masked[offset:] else masked
    raise line.error(f"block mask must be an integer offset or a list of booleans, got {value!r}")


def _json_lines(path: PathLike) -> Iterator[_Line]:
    """Yield each non-blank line of a JSONL file as a parsed object."""
    name = str(path)
    with open(path, encoding="utf-8") as handle:
        for lineno, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(f"invalid JSON: {exc.msg}", line=lineno, path=name) from None
            if not isinstance(obj, dict):
                raise TraceFormatError("expected a JSON object", line=lineno, path=name)
            yield _Line(obj, lineno, name)


def _us(value: float | int, per_second: int) -> int:
    """Convert a timestamp in 1/per_second units to integer microseconds."""
    scale = 1_000_000 // per_second
    return value * scale if type(value) is int else int(round(value * scale))


# ---------------------------------------------------------------------------- readers


def read_mooncake(path: PathLike, *, instance: str = DEFAULT_INSTANCE, **_: Any) -> Iterator[Record]:
    """Mooncake JSONL: each line is a request -- a read of ``hash_ids`` then a write of them."""
    for line in _json_lines(path):
        keys = line.integers("hash_ids")
        ts = _us(line.number("timestamp"), 1000)
        yield Record(instance, ts, Op.REQUEST, keys, 0, line.integer("input_length", 0))


def read_qwen_bailian(path: PathLike, *, instance: str = DEFAULT_INSTANCE, **_: Any) -> Iterator[Record]:
    """Qwen-Bailian JSONL: like Mooncake, with the timestamp in seconds and chat metadata."""
    for line in _json_lines(path):
        line.integer("chat_id")
        line.integer("parent_chat_id")
        line.integer("turn")
        line.text("type")
        keys = line.integers("hash_ids")
        ts = _us(line.number("timestamp"), 1)
        yield Record(instance, ts, Op.REQUEST, keys, 0, line.integer("input_length", 0))


def _keys_of(line: _Line, block_size: int | None) -> tuple[list[int], int]:
    """Block keys of an event/upstream line (``keys``, else derived from ``tokens``) and its token count."""
    keys = line.integers("keys", required=False)
    tokens = line.integers("tokens", required=False)
    if not keys and tokens:
        if not block_size:
            raise line.error("line gives tokens but no keys: pass the block size to derive keys")
        keys = block_keys_from_tokens(tokens, block_size)
    return keys, len(tokens)


def _written(keys: list[int], success: Any, line: _Line) -> tuple[list[int], int | tuple[bool, ...]]:
    """The keys of a write session and the mask of those that failed, from the finish's
    ``success_block`` (an offset: the first n keys; or bool flags, one per key)."""
    flags = success
    if isinstance(success, dict) and "offset" not in success:
        flags = (success.get("bool_masks") or success.get("boolMasks") or {}).get("values", [])
    if isinstance(flags, list) and len(flags) != len(keys):
        raise line.error(f"success_block has {len(flags)} flags for a session of {len(keys)} keys")
    ok = _normalize_mask(success, line)
    if isinstance(ok, int):
        return keys[:ok], 0
    # keep the failed keys in place, masked, so every written key keeps its true parent
    return keys, tuple(not flag for flag in ok)


_SESSION_EVENTS = ("StartWriteCache", "FinishWriteCache")


def _unfinished_sessions(path: PathLike) -> set[str]:
    """First pass over an event log: ids of write sessions that are started but never finished.

    Only open sessions are held (ids, not keys), so memory stays bounded by concurrency.
    """
    pending: set[str] = set()
    name = str(path)
    with open(path, encoding="utf-8") as handle:
        for lineno, text in enumerate(handle, 1):
            if "WriteCache" not in text:
                continue  # cheap filter: the second pass validates every line
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(f"invalid JSON: {exc.msg}", line=lineno, path=name) from None
            kind = obj.get("type") if isinstance(obj, dict) else None
            session = obj.get("write_session_id") if kind in _SESSION_EVENTS else None
            if isinstance(session, str):
                (pending.add if kind == "StartWriteCache" else pending.discard)(session)
    return pending


def read_kvcm_events(
    path: PathLike,
    *,
    block_size: int | None = None,
    unfinished_write_delay_us: int = UNFINISHED_WRITE_DELAY_US,
    **_: Any,
) -> Iterator[Record]:
    """The KVCM event log.

    * ``GetCacheLocation``  -> ``READ`` of ``keys`` with its ``block_mask`` and ``query_type``.
    * ``FinishWriteCache``  -> ``WRITE`` (at the finish time) of the keys of the
      ``StartWriteCache`` with the same ``write_session_id`` that ``success_block`` marks
      (offset: the first n keys; bool list: where true).
    * a ``StartWriteCache`` never finished in the whole log counts as written
      ``unfinished_write_delay_us`` after its start (emitted in time order).
    * other event types (``CacheReclaimSubmit``...) are the server's own actions and are
      skipped: the replay simulates its own eviction.

    The file is read twice: a cheap first pass finds the sessions that never finish, so the
    second pass can place their writes in time without holding more than the open sessions.
    """
    unfinished = _unfinished_sessions(path)
    open_sessions: dict[str, tuple[list[int], int]] = {}
    delayed: list[tuple[int, int, Record]] = []
    seq = 0
    for line in _json_lines(path):
        kind = line.text("type")
        ts = line.integer("trigger_time_us")
        while delayed and delayed[0][0] <= ts:
            yield heapq.heappop(delayed)[2]
        if kind == "GetCacheLocation":
            keys, n_tokens = _keys_of(line, block_size)
            sw_size = line.integer("sw_size", 0)
            yield Record(
                line.text("source"), ts, Op.READ, keys, line.mask("block_mask"), n_tokens, line.query(), max(sw_size, 0)
            )
        elif kind == "StartWriteCache":
            keys = _keys_of(line, block_size)[0]
            session = line.text("write_session_id")
            if session in unfinished:
                seq += 1
                due = ts + unfinished_write_delay_us
                heapq.heappush(delayed, (due, seq, Record(line.text("source"), due, Op.WRITE, keys)))
            else:
                open_sessions[session] = (keys, line.lineno)
        elif kind == "FinishWriteCache":
            session = line.text("write_session_id")
            started = open_sessions.pop(session, None)
            if started is None:
                continue  # its start is before the log begins: nothing to attribute it to
            if "success_block" not in line.obj and "success_blocks" not in line.obj:
                raise line.error("FinishWriteCache without success_block")
            success = line.obj.get("success_block", line.obj.get("success_blocks"))
            keys, failed = _written(started[0], success, line)
            yield Record(line.text("source"), ts, Op.WRITE, keys, failed)
    while delayed:
        yield heapq.heappop(delayed)[2]


_UPSTREAM_TYPES = {"get": Op.READ, "write": Op.WRITE, "request": Op.REQUEST}


def read_upstream(path: PathLike, *, block_size: int | None = None, **_: Any) -> Iterator[Record]:
    """The upstream optimizer schema JSONL.

    ``type`` selects get/write/request; without it the kind is inferred as upstream does: a
    dialog turn (``input_len``, ``output_len``, ``total_keys``) reads ``keys`` then writes
    ``total_keys``; a line with ``query_type`` or ``block_mask`` is a get; anything else a write.
    """
    for line in _json_lines(path):
        instance = line.text("instance_id", DEFAULT_INSTANCE) or DEFAULT_INSTANCE
        if line.has("timestamp_ns"):
            ts = line.integer("timestamp_ns") // 1000
        else:
            ts = line.integer("timestamp_us")
        keys, n_tokens = _keys_of(line, block_size)
        input_tokens = line.integer("input_len", n_tokens)
        kind = line.obj.get("type")
        if kind is not None:
            op = _UPSTREAM_TYPES.get(str(kind).lower())
            if op is None:
                raise line.error(f"unknown type {kind!r} (expected get, write or request)")
        elif all(line.has(f) for f in ("input_len", "output_len", "total_keys")):
            yield Record(
                instance,
                ts,
                Op.READ,
                keys,
                line.mask("block_mask"),
                input_tokens,
                line.query(),
                max(line.integer("sw_size", 0), 0),
            )
            yield Record(instance, ts, Op.WRITE, line.integers("total_keys"))
            continue
        else:
            op = Op.READ if (line.has("query_type") or line.has("block_mask")) else Op.WRITE
        if op is Op.WRITE:
            yield Record(instance, ts, op, keys)
        else:
            yield Record(
                instance,
                ts,
                op,
                keys,
                line.mask("block_mask"),
                input_tokens,
                line.query(),
                max(line.integer("sw_size", 0), 0),
            )


# ---------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class TraceFormat:
    """A supported trace format: its reader and the block size (tokens) it implies."""

    name: str
    reader: Callable[..., Iterator[Record]]
    block_size: int
    description: str


FORMATS: dict[str, TraceFormat] = {
    fmt.name: fmt
    for fmt in (
        TraceFormat("mooncake", read_mooncake, 512, "Mooncake JSONL (hash_ids, timestamp in ms)"),
        TraceFormat(
            "qwen_bailian",
            read_qwen_bailian,
            16,
            "Qwen-Bailian JSONL (chat_id, parent_chat_id, timestamp in s, hash_ids)",
        ),
        TraceFormat("kvcm_events", read_kvcm_events, 16, "KVCM event log (GetCacheLocation, ...)"),
        TraceFormat(
            "upstream", read_upstream, 16, "upstream optimizer schema JSONL (instance_id, timestamp_us, keys/tokens)"
        ),
    )
}
_ALIASES = {
    "bailian": "qwen_bailian",
    "qwen": "qwen_bailian",
    "events": "kvcm_events",
    "event_log": "kvcm_events",
    "kvcm": "kvcm_events",
    "optimizer": "upstream",
}
_EVENT_TYPES = {"GetCacheLocation", "StartWriteCache", "FinishWriteCache", "CacheReclaimSubmit"}


def sniff_format(path: PathLike) -> str:
    """Guess the format of a trace from its first non-blank line."""
    for line in _json_lines(path):
        obj = line.obj
        if "hash_ids" in obj:
            return "qwen_bailian" if "chat_id" in obj or "parent_chat_id" in obj else "mooncake"
        if "trigger_time_us" in obj or obj.get("type") in _EVENT_TYPES:
            return "kvcm_events"
        if any(f in obj for f in ("instance_id", "timestamp_us", "timestamp_ns")):
            return "upstream"
        raise line.error("cannot tell the trace format from this line; pass --format")
    raise TraceFormatError("empty trace", path=str(path))


def resolve_format(path: PathLike, fmt: str = "auto") -> TraceFormat:
    """The :class:`TraceFormat` named ``fmt`` (aliases accepted), sniffing when ``auto``."""
    name = fmt.strip().lower().replace("-", "_")
    if name == "auto":
        name = sniff_format(path)
    name = _ALIASES.get(name, name)
    if name not in FORMATS:
        raise ConfigError(f"unknown trace format {fmt!r}; choose auto or one of {', '.join(FORMATS)}")
    return FORMATS[name]


def read_trace(
    path: PathLike, fmt: str = "auto", *, instance: str | None = None, block_size: int | None = None
) -> Iterator[Record]:
    """Stream the records of a trace file of format ``fmt`` (``auto`` sniffs it).

    ``instance`` names the single instance of request-level formats (Mooncake, Qwen-Bailian);
    ``block_size`` (tokens per block) is needed only to derive keys from ``tokens``.
    """
    trace_format = resolve_format(path, fmt)
    options: dict[str, Any] = {"block_size": block_size or trace_format.block_size}
    if instance:
        options["instance"] = instance
    return trace_format.reader(path, **options)
