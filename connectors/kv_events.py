"""vLLM's (and SGLang's) KV-cache event stream, decoded from its published schema.

The engine publishes on a ZMQ PUB socket (vLLM ``ZmqEventPublisher``; SGLang copies it)
multipart messages ``(topic, seq, payload)``: ``seq`` an 8-byte big-endian sequence number,
``payload`` a msgpack ``KVEventBatch`` encoded by msgspec with ``array_like=True``:

- batch: ``[ts, events, data_parallel_rank?]``
- events, tagged by class name first: ``["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium?]``, ``["BlockRemoved", block_hashes, medium?]``,
  ``["AllBlocksCleared"]``

(``vllm/distributed/kv_events.py``; trailing fields at their default are omitted.) Missed
sequence numbers are asked of the ROUTER replay socket: send ``(b"", start_seq)``, receive
``(b"", seq, payload)`` frames up to ``seq == -1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

END_SEQ = -1


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[object]
    parent_block_hash: object | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[object]
    medium: str | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
_TYPES = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


@dataclass(frozen=True)
class EventBatch:
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


class MalformedBatchError(ValueError):
    """A payload that is not a KVEventBatch."""


def decode_batch(payload: bytes) -> EventBatch:
    """The batch of one message's payload; MalformedBatchError if it is not one."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        ts, items, *rest = raw
        events = []
        for item in items:
            kind = _TYPES[item[0]]
            events.append(kind(*item[1:]))
        return EventBatch(float(ts), events, rest[0] if rest else None)
    except (ValueError, TypeError, KeyError, IndexError, msgpack.UnpackException) as exc:
        raise MalformedBatchError(f"not a KVEventBatch: {exc}") from None


def sequence_number(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


def block_key(block_hash: object) -> int:
    """An engine block hash as a signed int64 block key: ints wrap to 64 bits, bytes (vLLM's
    newer hashes) give their first 8 bytes."""
    if isinstance(block_hash, (bytes, bytearray)):
        return int.from_bytes(bytes(block_hash[:8]).rjust(8, b"\0"), "big", signed=True)
    if isinstance(block_hash, int):
        value = block_hash & ((1 << 64) - 1)
        return value - (1 << 64) if value >= 1 << 63 else value
    raise MalformedBatchError(f"block hash {block_hash!r} is neither an int nor bytes")
