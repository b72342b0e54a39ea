"""vLLM's and SGLang's KV-cache event streams, decoded by field name.

Both engines publish on a ZMQ PUB socket (their ``ZmqEventPublisher``) multipart messages
``(topic, seq, payload)``: ``seq`` an 8-byte big-endian sequence number counted from 0 by
each publisher, ``payload`` a msgpack ``KVEventBatch`` encoded by msgspec. The decoder
follows the forms the engines have shipped rather than one snapshot of their schema:

- the batch: a positional array ``[ts, events, data_parallel_rank]`` (SGLang names the rank
  ``attn_dp_rank``), or a map of those names;
- each event: a map tagged ``{"type": "BlockStored", <field>: ...}`` (vLLM 0.33, SGLang
  0.5.x: msgspec ``tag=True``, fields at their default omitted), or the older positional
  array ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
  medium, lora_name]`` (6 fields, then 7 with ``lora_name``).

Fields are read by name; unknown ones are ignored and missing optional ones default, so an
engine adding a field changes nothing here. Event types this module does not know are
counted in ``EventBatch.unknown`` and skipped.

Missed sequence numbers are asked of the ROUTER replay socket: send ``(b"", start_seq)``;
it answers ``(b"", topic, seq, payload)`` per buffered batch from ``start_seq`` (older
versions without the topic), then ``(b"", b"", END_SEQ, b"")``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgpack

END_SEQ = -1
_INT64 = 1 << 64

#: An engine's block hash: an int (vLLM with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, its
#: default, and SGLang) or the digest's bytes.
BlockHash = int | bytes


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    #: One entry per block (vLLM): the LoRA name, ``(mm_identifier, offset)`` pairs, the
    #: cache salt and prompt-embedding digests that entered the block's hash.
    extra_keys: list[object] | None = None
    #: The KV-cache group (vLLM hybrid models emit one BlockStored per group).
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    #: SGLang: the salt of the request that stored the blocks.
    cache_salt: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None
    #: The types of the events skipped because this module does not know them.
    unknown: tuple[str, ...] = field(default=())


class MalformedBatchError(ValueError):
    """A payload that is not a KVEventBatch of a known form."""


#: The positional order of each event's fields in the engines' older array form.
_POSITIONAL = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _fields(item: object) -> tuple[str, Mapping[str, object]]:
    """An event's type and its fields by name, from either form."""
    if isinstance(item, Mapping):
        kind = item.get("type")
        if not isinstance(kind, str):
            raise MalformedBatchError("an event map has no string 'type'")
        return kind, item
    if isinstance(item, Sequence) and not isinstance(item, (str, bytes)) and item and isinstance(item[0], str):
        kind, values = item[0], item[1:]
        names = _POSITIONAL.get(kind, ())
        if len(values) > len(names):
            raise MalformedBatchError(f"{kind} has {len(values)} positional fields, at most {len(names)} are known")
        return kind, dict(zip(names, values, strict=False))
    raise MalformedBatchError(f"an event is neither a tagged map nor a tagged array: {type(item).__name__}")


def _hashes(kind: str, fields: Mapping[str, object], name: str) -> list[BlockHash]:
    value = fields.get(name)
    if not isinstance(value, list) or not all(isinstance(h, (int, bytes)) for h in value):
        raise MalformedBatchError(f"{kind}.{name} must be a list of ints or bytes")
    return value


def _optional[T](kind: str, fields: Mapping[str, object], name: str, types: type[T] | tuple[type, ...]) -> T | None:
    value = fields.get(name)
    if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
        raise MalformedBatchError(f"{kind}.{name} has the wrong type: {type(value).__name__}")
    return value  # type: ignore[return-value]


def decode_event(item: object) -> KVEvent | str:
    """One event; the type's name (a str) for a type this module does not know."""
    kind, fields = _fields(item)
    if kind == "BlockStored":
        parent = fields.get("parent_block_hash")
        if parent is not None and not isinstance(parent, (int, bytes)):
            raise MalformedBatchError("BlockStored.parent_block_hash must be an int, bytes or null")
        tokens = fields.get("token_ids")
        # By type, not item by item: a 100-block batch of vLLM's carries 1,600 token ids.
        if not isinstance(tokens, list) or not all(issubclass(t, int) for t in set(map(type, tokens))):
            raise MalformedBatchError("BlockStored.token_ids must be a list of ints")
        block_size = _optional(kind, fields, "block_size", int)
        if block_size is None or block_size <= 0:
            raise MalformedBatchError("BlockStored.block_size must be a positive int")
        extra_keys = _optional(kind, fields, "extra_keys", list)
        return BlockStored(
            block_hashes=_hashes(kind, fields, "block_hashes"),
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=block_size,
            lora_id=_optional(kind, fields, "lora_id", int),
            medium=_optional(kind, fields, "medium", str),
            lora_name=_optional(kind, fields, "lora_name", str),
            extra_keys=extra_keys,
            group_idx=_optional(kind, fields, "group_idx", int),
            kv_cache_spec_kind=_optional(kind, fields, "kv_cache_spec_kind", str),
            kv_cache_spec_sliding_window=_optional(kind, fields, "kv_cache_spec_sliding_window", int),
            cache_salt=_optional(kind, fields, "cache_salt", str),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(
            block_hashes=_hashes(kind, fields, "block_hashes"),
            medium=_optional(kind, fields, "medium", str),
            group_idx=_optional(kind, fields, "group_idx", int),
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return kind


def _batch_fields(raw: object) -> tuple[object, object, object]:
    if isinstance(raw, Mapping):
        rank = raw.get("data_parallel_rank", raw.get("attn_dp_rank"))
        return raw.get("ts"), raw.get("events"), rank
    if isinstance(raw, list) and 2 <= len(raw) <= 3:
        return raw[0], raw[1], raw[2] if len(raw) == 3 else None
    raise MalformedBatchError(f"a batch is neither [ts, events, rank] nor a map: {type(raw).__name__}")


def decode_batch(payload: bytes) -> EventBatch:
    """The batch of one message's payload; MalformedBatchError (naming what is wrong) if it
    is not one."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise MalformedBatchError(f"not msgpack: {exc}") from None
    ts, items, rank = _batch_fields(raw)
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise MalformedBatchError("the batch's ts must be a number")
    if not isinstance(items, list):
        raise MalformedBatchError("the batch's events must be a list")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        raise MalformedBatchError("the batch's data_parallel_rank must be an int or null")
    events: list[KVEvent] = []
    unknown: list[str] = []
    for item in items:
        event = decode_event(item)
        if isinstance(event, str):
            unknown.append(event)
        else:
            events.append(event)
    return EventBatch(float(ts), events, rank, tuple(unknown))


def sequence_number(frame: bytes) -> int:
    """A message's 8-byte big-endian sequence number (END_SEQ is -1)."""
    if len(frame) != 8:
        raise MalformedBatchError(f"a sequence number frame of {len(frame)} bytes, not 8")
    return int.from_bytes(frame, "big", signed=True)


def replay_frame(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """``(seq, payload)`` of a replay answer as the DEALER receives it: ``(b"", topic, seq,
    payload)``, or ``(b"", seq, payload)`` from publishers that send no topic."""
    if len(frames) not in (3, 4) or frames[0] != b"":
        raise MalformedBatchError(f"a replay answer of {len(frames)} frames, not (b'', [topic,] seq, payload)")
    return sequence_number(frames[-2]), frames[-1]


def block_key(block_hash: object) -> int:
    """An engine block hash as KVCM's signed int64 block key: its low 64 bits.

    This is vLLM's own conversion (``maybe_convert_block_hash`` under
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``: ``int.from_bytes(digest, "big") & (2**64 - 1)``,
    i.e. the digest's last 8 bytes, big-endian), so a bytes hash and the int vLLM would have
    published for it give the same key; read as signed, as upstream's subscriber does."""
    if isinstance(block_hash, (bytes, bytearray)):
        value = int.from_bytes(bytes(block_hash[-8:]), "big")
    elif isinstance(block_hash, int) and not isinstance(block_hash, bool):
        value = block_hash % _INT64
    else:
        raise MalformedBatchError(f"block hash {block_hash!r} is neither an int nor bytes")
    return value - _INT64 if value >= 1 << 63 else value


#: Engine media (vLLM's ``MEDIUM_*``, SGLang's ``StorageMedium``) → KVCM media (upstream's
#: names: ``gpu``, ``mem``, ``disk``). A medium not listed keeps its name, lower-cased.
DEFAULT_MEDIA: Mapping[str, str] = {
    "GPU": "gpu",
    "CPU": "mem",
    "CPU_PINNED": "mem",
    "DISK": "disk",
    "STORAGE": "disk",
    "EXTERNAL": "external",
}
