"""Stored block records built byte by byte (the layout of lua/prelude.lua), for tests
that need records without going through the scripts."""

import struct

from chalicelib.index import Status


def record(locations, parent=None, children=0, atime=0, lfu=5, wtime_ms=0) -> bytes:
    """A record; ``locations`` are (status, storage index, spec group, location id)."""
    head = struct.pack(
        ">B8sHIB", 1 if parent is not None else 0, (parent or 0).to_bytes(8, "big", signed=True), children, atime, lfu
    )
    head += wtime_ms.to_bytes(6, "big") + bytes((len(locations),))
    return head + b"".join(
        struct.pack(">BBB", st, sidx, sg) + loc.to_bytes(5, "big") + bytes(8) for st, sidx, sg, loc in locations
    )


def serving(location_id: int, **kw) -> bytes:
    """A record with one SERVING location on storage 1, spec group 0."""
    return record([(Status.SERVING, 1, 0, location_id)], **kw)
