"""Where a batch job reads the event log back: time-partitioned objects per group.

``KVCM_EVENT_LOG=s3://bucket/prefix`` (AWS) or ``dir:/path`` (or a path ending in ``/``;
locally) keeps the lines of each instance group in objects named

    <prefix>/events/<group>/<YYYY-MM-DD>/<HH>/<container>-<seq>.jsonl

(UTC hour of the events' ``trigger_time_us``; the group name percent-escaped). A container
buffers lines per group and hour and writes one object per buffer when it holds
``FLUSH_BYTES``, when its oldest line is ``FLUSH_AGE_S`` old (checked as lines arrive: no
write per request), and when a job ends (``flush``). Lines of one object are in time
order; objects of several containers interleave, so a reader sorts what it reads.

A container that stops taking requests keeps its buffer until its next request or job:
at most ``FLUSH_AGE_S`` of its events are lost if it is shut down meanwhile. A failed
write keeps the lines for the next flush, up to ``MAX_BUFFER_BYTES``; past that the
oldest buffers are dropped (counted in ``dropped_lines`` and logged).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol
from urllib.parse import quote

from .logging import logger

FLUSH_BYTES = 1 << 20
FLUSH_AGE_S = 60.0
MAX_BUFFER_BYTES = 16 << 20
#: Group of events whose instance is unknown (removed meanwhile).
UNKNOWN_GROUP = "_unknown"
#: ``KVCM_EVENT_LOG`` prefixes naming a local directory and an S3 bucket (adapters:
#: ``storage.objects``).
DIR_SCHEME = "dir:"
S3_SCHEME = "s3://"


class ObjectStore(Protocol):
    """Where partitioned objects go: put, list under a prefix, get (``storage.objects``
    has the directory and S3 adapters)."""

    def put(self, key: str, body: bytes) -> None: ...

    def keys(self, prefix: str) -> Iterator[str]: ...

    def get(self, key: str) -> bytes: ...

    def uri(self, key: str) -> str: ...


def is_partitioned(target: str) -> bool:
    """Whether a ``KVCM_EVENT_LOG`` value names partitioned storage (S3 or a directory)."""
    return target.startswith((S3_SCHEME, DIR_SCHEME)) or target.endswith(("/", os.sep))


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def group_prefix(prefix: str, group: str, kind: str = "events") -> str:
    """The key prefix of one group's objects of ``kind`` (``events``; the tuning job
    writes ``tuning`` beside them)."""
    return _join(prefix, kind, quote(group, safe="")) + "/"


def _hour(time_us: int) -> datetime:
    return datetime.fromtimestamp(time_us / 1e6, tz=UTC).replace(minute=0, second=0, microsecond=0)


def hour_prefix(prefix: str, group: str, hour: datetime) -> str:
    """The key prefix of one group's objects of one UTC hour."""
    return group_prefix(prefix, group) + hour.strftime("%Y-%m-%d/%H") + "/"


@dataclass
class _Buffer:
    lines: list[str] = field(default_factory=list)
    size: int = 0
    since: float = 0.0  # monotonic time of the oldest line


class PartitionedEventWriter:
    """Buffers event lines per (group, hour) and writes them as objects; thread-safe."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str = "",
        container_id: str | None = None,
        flush_bytes: int = FLUSH_BYTES,
        flush_age_s: float = FLUSH_AGE_S,
        max_buffer_bytes: int = MAX_BUFFER_BYTES,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.container_id = container_id or uuid.uuid4().hex[:12]
        self.flush_bytes = flush_bytes
        self.flush_age_s = flush_age_s
        self.max_buffer_bytes = max_buffer_bytes
        self.dropped_lines = 0
        self._monotonic = monotonic
        self._buffers: dict[tuple[str, datetime], _Buffer] = {}
        self._size = 0
        self._seq = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()

    def append(self, group: str, time_us: int, line: str) -> None:
        """Buffer ``line`` (no newline); writes when a buffer is due (size or age)."""
        now = self._monotonic()
        with self._lock:
            buffer = self._buffers.setdefault((group or UNKNOWN_GROUP, _hour(time_us)), _Buffer(since=now))
            buffer.lines.append(line)
            buffer.size += len(line) + 1
            self._size += len(line) + 1
            due = (
                self._size >= self.flush_bytes or now - min(b.since for b in self._buffers.values()) >= self.flush_age_s
            )
        if due:
            self.flush()

    def pending(self) -> int:
        """Lines buffered, not yet written."""
        with self._lock:
            return sum(len(b.lines) for b in self._buffers.values())

    def flush(self) -> int:
        """Write every buffer as one object; returns the lines written. A failed write
        keeps its lines for the next flush (within ``max_buffer_bytes``)."""
        with self._flush_lock:
            with self._lock:
                taken, self._buffers, self._size = self._buffers, {}, 0
            written = 0
            failed: dict[tuple[str, datetime], _Buffer] = {}
            for (group, hour), buffer in sorted(taken.items(), key=lambda item: item[1].since):
                with self._lock:
                    self._seq += 1
                    key = f"{hour_prefix(self.prefix, group, hour)}{self.container_id}-{self._seq:06d}.jsonl"
                try:
                    self.store.put(key, ("\n".join(buffer.lines) + "\n").encode())
                    written += len(buffer.lines)
                except Exception as exc:  # noqa: BLE001 - events never fail the caller
                    logger.warning(
                        "event log not written",
                        extra={"key": key, "lines": len(buffer.lines), "error": f"{type(exc).__name__}: {exc}"},
                    )
                    failed[(group, hour)] = buffer
            if failed:
                self._keep(failed)
            return written

    def _keep(self, failed: dict[tuple[str, datetime], _Buffer]) -> None:
        """Put back what was not written, newest first, within ``max_buffer_bytes``."""
        with self._lock:
            room = self.max_buffer_bytes - self._size
            for slot, buffer in sorted(failed.items(), key=lambda item: -item[1].since):
                if buffer.size > room:
                    self.dropped_lines += len(buffer.lines)
                    logger.warning("event log lines dropped", extra={"lines": len(buffer.lines)})
                    continue
                room -= buffer.size
                mine = self._buffers.setdefault(slot, _Buffer(since=buffer.since))
                mine.lines[:0] = buffer.lines
                mine.size += buffer.size
                mine.since = min(mine.since, buffer.since)
                self._size += buffer.size


def read_group_lines(store: ObjectStore, prefix: str, group: str, start_us: int, end_us: int) -> list[str]:
    """Every event line of ``group`` with ``start_us <= trigger_time_us < end_us``, in time
    order (objects of several containers merged)."""
    stamped: list[tuple[int, int, str]] = []
    hour = _hour(start_us)
    while hour.timestamp() * 1e6 < end_us:
        for key in store.keys(hour_prefix(prefix, group, hour)):
            for text in store.get(key).decode("utf-8").splitlines():
                if not text.strip():
                    continue
                stamp = json.loads(text).get("trigger_time_us", 0)
                if start_us <= stamp < end_us:
                    stamped.append((stamp, len(stamped), text))
        hour += timedelta(hours=1)
    stamped.sort()
    return [text for _, _, text in stamped]
