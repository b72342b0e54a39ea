"""The event log: one JSON line per meta call in upstream's event-publisher format.

Off unless ``KVCM_EVENT_LOG`` names where the lines go: a file, ``stdout`` (on Lambda,
the function's log stream), or time-partitioned objects per instance group that a batch
job reads back -- ``s3://bucket/prefix`` or ``dir:/path`` (``event_store``). The optimizer
replays these logs, which need only block keys: a request's ``token_ids`` are prompt
content, so events carry the keys derived from them and an empty ``tokens``, unless
``KVCM_EVENT_LOG_TOKENS`` asks for them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from ..clock import Clock
from ..protocol.block_keys import BlockKeyScheme
from ..protocol.codes import ErrorCode, QueryType
from ..protocol.models import BlockMask
from .event_store import ObjectStore, PartitionedEventWriter, is_partitioned

_QUERY_NAMES = {
    QueryType.QT_PREFIX_MATCH: "prefix_match",
    QueryType.QT_BATCH_GET: "batch_get",
    QueryType.QT_REVERSE_ROLL_SW_MATCH: "reverse_roll_sw_match",
}
_ALPHABET = b"abcdefghijklmnopqrstuvwxyz0123456789"
_RECORDED = ("getCacheLocation", "startWriteCache", "finishWriteCache")
#: ``KVCM_EVENT_LOG`` value sending the lines to standard output.
STDOUT = "stdout"


def _event_id() -> str:
    return bytes(_ALPHABET[b % 36] for b in os.urandom(32)).decode()


def _mask(mask: BlockMask | None) -> Any:
    if mask is None:
        return 0
    if mask.bool_masks is not None:
        return list(mask.bool_masks.values)
    return mask.offset or 0


class EventLog:
    """Appends event lines to a stream, or to partitioned objects per group (``writer``;
    ``group_of`` names an instance's group); thread-safe. Neither = disabled."""

    def __init__(
        self,
        stream: TextIO | None,
        writer: PartitionedEventWriter | None = None,
        group_of: Callable[[str], str] = lambda instance_id: "",
    ) -> None:
        self._stream = stream
        self._writer = writer
        self._group_of = group_of
        self._lock = threading.Lock()

    @classmethod
    def from_settings(
        cls,
        path: str,
        open_objects: Callable[[str], tuple[ObjectStore, str]] | None = None,
        group_of: Callable[[str], str] = lambda instance_id: "",
    ) -> EventLog:
        """The log ``KVCM_EVENT_LOG`` asks for: none (empty), ``stdout``, partitioned
        objects (``s3://bucket/prefix``, ``dir:/path`` or a path ending in ``/``: the
        store and key prefix ``open_objects`` gives for it), or a file."""
        if not path:
            return cls(None)
        if path == STDOUT:
            return cls(sys.stdout)
        if is_partitioned(path):
            if open_objects is None:
                raise ValueError(f"event log {path!r}: no object store to write it to")
            store, prefix = open_objects(path)
            return cls(None, PartitionedEventWriter(store, prefix), group_of)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return cls(open(path, "a", buffering=1, encoding="utf-8"))

    @property
    def enabled(self) -> bool:
        return self._stream is not None or self._writer is not None

    def publish(self, source: str, event_type: str, trigger_time_us: int, **fields: Any) -> None:
        if not self.enabled:
            return
        line = json.dumps(
            {
                "id": _event_id(),
                "source": source,
                "component": "cache_manager",
                "type": event_type,
                "trigger_time_us": trigger_time_us,
                **fields,
            },
            separators=(",", ":"),
        )
        if self._writer is not None:
            self._writer.append(self._group(source), trigger_time_us, line)
            return
        if self._stream is not None:
            with self._lock:
                self._stream.write(line + "\n")

    def _group(self, instance_id: str) -> str:
        try:
            return self._group_of(instance_id)
        except Exception:  # noqa: BLE001 - an instance removed meanwhile: its events are kept apart
            return ""

    def flush(self) -> int:
        """Write what the partitioned writer buffers (a job's end); lines written."""
        return self._writer.flush() if self._writer is not None else 0


class _Registered(Protocol):
    @property
    def block_size(self) -> int: ...

    @property
    def block_key_scheme(self) -> BlockKeyScheme: ...


class InstanceLookup(Protocol):
    """Where an instance's block size and key scheme are found (``control.ConfigCache``)."""

    def instance(self, instance_id: str) -> _Registered: ...


class EventRecorder:
    """Observer of the meta operations: publishes the calls the optimizer replays."""

    def __init__(self, events: EventLog, instances: InstanceLookup, clock: Clock, with_tokens: bool) -> None:
        self.events = events
        self.instances = instances
        self.clock = clock
        self.with_tokens = with_tokens

    def _keys_and_tokens(self, request: Any) -> tuple[Any, list[int]]:
        """What an event says of the blocks asked for: the request's keys (derived from its
        token ids when it sent only those) and, only when the settings ask, the token ids."""
        block_keys, token_ids = getattr(request, "block_keys", []), getattr(request, "token_ids", [])
        tokens = list(token_ids) if self.with_tokens else []
        if block_keys or not token_ids:
            return block_keys, tokens
        registered = self.instances.instance(request.instance_id)
        return registered.block_key_scheme.keys(token_ids, registered.block_size), tokens

    def record(self, api_name: str, request: Any, response: Any, code: ErrorCode) -> None:
        """Publish one call (successful calls of the replayed methods only)."""
        events = self.events
        if not events.enabled or code != ErrorCode.OK or api_name not in _RECORDED:
            return
        now_us = int(self.clock.now() * 1e6)
        keys, tokens = self._keys_and_tokens(request)
        if api_name == "getCacheLocation":
            sw = request.sw_size if request.query_type == QueryType.QT_REVERSE_ROLL_SW_MATCH else -1
            events.publish(
                request.instance_id,
                "GetCacheLocation",
                now_us,
                query_type=_QUERY_NAMES.get(request.query_type, "unspecified"),
                keys=keys,
                tokens=tokens,
                block_mask=_mask(request.block_mask),
                sw_size=sw,
                location_spec_names=request.location_spec_names,
            )
        elif api_name == "startWriteCache":
            events.publish(
                request.instance_id,
                "StartWriteCache",
                now_us,
                write_session_id=response.write_session_id,
                keys=keys,
                tokens=tokens,
                block_mask=_mask(response.block_mask),
                location_spec_group_names=request.location_spec_group_names,
                write_timeout_seconds=request.write_timeout_seconds,
            )
        else:
            events.publish(
                request.instance_id,
                "FinishWriteCache",
                now_us,
                write_session_id=request.write_session_id,
                success_block=_mask(request.success_blocks),
            )
