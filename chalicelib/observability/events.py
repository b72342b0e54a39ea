"""The event log: one JSON line per meta call in upstream's event-publisher format.

Off unless ``KVCM_EVENT_LOG`` names where the lines go: a file, or ``stdout`` (on Lambda,
the function's log stream). The optimizer replays these logs, which need only block
keys: a request's ``token_ids`` are prompt content, so events carry the keys derived
from them and an empty ``tokens``, unless ``KVCM_EVENT_LOG_TOKENS`` asks for them.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any, Optional, TextIO

from ..cache.keys import keys_from_tokens
from ..protocol.codes import ErrorCode, QueryType
from ..protocol.models import BlockMask

_QUERY_NAMES = {QueryType.QT_PREFIX_MATCH: "prefix_match", QueryType.QT_BATCH_GET: "batch_get",
                QueryType.QT_REVERSE_ROLL_SW_MATCH: "reverse_roll_sw_match"}
_ALPHABET = b"abcdefghijklmnopqrstuvwxyz0123456789"
#: ``KVCM_EVENT_LOG`` value sending the lines to standard output.
STDOUT = "stdout"


def _event_id() -> str:
    return bytes(_ALPHABET[b % 36] for b in os.urandom(32)).decode()


def _mask(mask: Optional[BlockMask]) -> Any:
    if mask is None:
        return 0
    if mask.bool_masks is not None:
        return list(mask.bool_masks.values)
    return mask.offset or 0


class EventLog:
    """Appends event lines to a stream; thread-safe. ``None`` stream = disabled."""

    def __init__(self, stream: Optional[TextIO]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, path: str) -> "EventLog":
        """The log ``KVCM_EVENT_LOG`` asks for: none (empty), ``stdout``, or a file."""
        if not path:
            return cls(None)
        if path == STDOUT:
            return cls(sys.stdout)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return cls(open(path, "a", buffering=1, encoding="utf-8"))

    @property
    def enabled(self) -> bool:
        return self._stream is not None

    def publish(self, source: str, event_type: str, trigger_time_us: int, **fields: Any) -> None:
        if self._stream is None:
            return
        line = json.dumps({"id": _event_id(), "source": source, "component": "cache_manager", "type": event_type,
                           "trigger_time_us": trigger_time_us, **fields}, separators=(",", ":"))
        with self._lock:
            self._stream.write(line + "\n")


def _keys_and_tokens(runtime, request) -> tuple[Any, list[int]]:
    """What an event says of the blocks asked for: the request's keys (derived from its
    token ids when it sent only those) and, only when the settings ask, the token ids."""
    block_keys, token_ids = getattr(request, "block_keys", []), getattr(request, "token_ids", [])
    tokens = list(token_ids) if runtime.settings.event_log_tokens else []
    if block_keys or not token_ids:
        return block_keys, tokens
    return keys_from_tokens(token_ids, runtime.config.instance(request.instance_id).block_size), tokens


def record_event(runtime, op, request, response, code: ErrorCode) -> None:
    """Observer of the meta operations: publishes the calls the optimizer replays."""
    events: EventLog = runtime.events
    if not events.enabled or code != ErrorCode.OK:
        return
    now_us = int(runtime.clock.now() * 1e6)
    keys, tokens = _keys_and_tokens(runtime, request)
    if op.api_name == "getCacheLocation":
        sw = request.sw_size if request.query_type == QueryType.QT_REVERSE_ROLL_SW_MATCH else -1
        events.publish(request.instance_id, "GetCacheLocation", now_us,
                       query_type=_QUERY_NAMES.get(request.query_type, "unspecified"), keys=keys,
                       tokens=tokens, block_mask=_mask(request.block_mask), sw_size=sw,
                       location_spec_names=request.location_spec_names)
    elif op.api_name == "startWriteCache":
        events.publish(request.instance_id, "StartWriteCache", now_us, write_session_id=response.write_session_id,
                       keys=keys, tokens=tokens, block_mask=_mask(response.block_mask),
                       location_spec_group_names=request.location_spec_group_names,
                       write_timeout_seconds=request.write_timeout_seconds)
    elif op.api_name == "finishWriteCache":
        events.publish(request.instance_id, "FinishWriteCache", now_us, write_session_id=request.write_session_id,
                       success_block=_mask(request.success_blocks))
