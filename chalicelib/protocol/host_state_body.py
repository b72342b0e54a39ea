"""getHostCacheState's body without the stdlib JSON decode and a pydantic pass over its keys
(issue #25 item 2).

A routing request carries up to 262,144 block keys, nearly always a JSON array of decimal
strings (proto3 JSON prints int64 so) or of numbers. ``decode_host_state_body`` decodes the
body in the routers' spelling (snake_case names, the query type by name, no nulls, no
unknown fields) with msgspec, the keys turned into integers in C. Anything else is
``None`` and takes the pydantic path, so every accepted body means what it meant there
and every error stays the one it was.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from .codes import QueryType
from .reported_events import HeaderStruct, WireStruct
from .wire import INT64_MAX, INT64_MIN

_QUERY_TYPES = {member.name: member for member in QueryType}
#: What may stand in the keys' array for the lax decode below to mean what the pydantic
#: path's ``-?[0-9]+`` strings and integer numbers mean: msgspec's lax mode also reads
#: "1.0", "1e3" or "\u0031" as integers, which the pydantic path refuses as strings.
_KEY_ARRAY_BYTES = b'0123456789-,"[] \t\r\n'
#: The keys as int64, from JSON numbers or strings of them (``strict=False``), range
#: checked in C.
_INT64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
_KEYS = msgspec.json.Decoder(list[_INT64], strict=False)


class HostStateBody(WireStruct):
    """A getHostCacheState body in the routers' spelling; the keys still as their JSON."""

    instance_id: str = ""
    query_type: str = "QT_UNSPECIFIED"
    block_cache_keys: msgspec.Raw = msgspec.Raw(b"[]")
    medium: list[str] = []
    p2p_host_count: int = 0
    trace_id: str = ""
    header: HeaderStruct | None = None

    @property
    def query(self) -> QueryType:
        return _QUERY_TYPES[self.query_type]


_DECODER = msgspec.json.Decoder(HostStateBody)


def decode_keys(raw: bytes, limit: int) -> list[int] | None:
    """The keys of a JSON array of in-range int64 numbers or decimal strings, at most
    ``limit`` of them; None for any other array (the pydantic path names the fault)."""
    if raw.translate(None, _KEY_ARRAY_BYTES):
        return None
    try:
        keys = _KEYS.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return keys if len(keys) <= limit else None


def decode_host_state_body(raw: bytes | str, max_keys: int) -> tuple[HostStateBody, list[int]] | None:
    """The body and its keys (at most ``max_keys``), decoded and type-checked in one pass
    (UTF-8 checked: no string holds an unpaired surrogate), or None when it is not in the
    routers' spelling (the pydantic path then decides)."""
    try:
        body = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if body.query_type not in _QUERY_TYPES or not INT64_MIN <= body.p2p_host_count <= INT64_MAX:
        return None
    keys = decode_keys(bytes(body.block_cache_keys), max_keys)
    return None if keys is None else (body, keys)
