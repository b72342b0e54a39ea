"""Index records → wire CacheLocations, for one request at a time.

A response can carry hundreds of locations; the renderer resolves each storage index
and spec group once per request and lets the backend prepare its URI builder once.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..index import Status
from ..index.records import HEADER_LEN, LOCATION_LEN
from ..protocol.codes import StorageType
from ..protocol.models import CacheLocation
from ..storage.base import SpecSlot, UriBuilder
from .context import InstanceContext, StorageState

SERVING_ONLY = (Status.SERVING,)
ANY_STATUS = (Status.WRITING, Status.SERVING, Status.DELETING)


def cache_location(type_name: str, names: list[str], uris: list[str]) -> CacheLocation:
    return {"type": type_name, "spec_size": len(names),
            "location_specs": [{"name": n, "uri": u} for n, u in zip(names, uris)]}


class LocationRenderer:
    """Renders the best location of records of one instance, filtered to ``spec_names``."""

    def __init__(self, ctx: InstanceContext, storage_name: Callable[[int], str],
                 spec_names: Optional[frozenset] = None) -> None:
        self._ctx = ctx
        self._storage_name = storage_name
        self._filter = spec_names
        self._states: dict[int, Optional[StorageState]] = {}
        self._builders: dict[tuple[int, int], tuple[str, list[str], UriBuilder]] = {}

    def _slots(self, spec_group: int) -> tuple[SpecSlot, ...]:
        slots = self._ctx.spec_layout.slots(spec_group)
        return slots if self._filter is None else tuple(s for s in slots if s.name in self._filter)

    def _state(self, sidx: int) -> Optional[StorageState]:
        """The storage of an index if it may serve reads now, else None."""
        if sidx not in self._states:
            state = self._ctx.by_name.get(self._storage_name(sidx))
            self._states[sidx] = state if state is not None and state.available else None
        return self._states[sidx]

    def builder(self, state: StorageState, sidx: int, spec_group: int) -> tuple[str, list[str], UriBuilder]:
        key = (sidx, spec_group)
        if key not in self._builders:
            slots = self._slots(spec_group)
            self._builders[key] = (state.storage_type.name, [s.name for s in slots],
                                   state.backend.uri_builder(self._ctx.instance_id, slots))
        return self._builders[key]

    def location(self, block_key: int, raw: bytes, statuses: tuple[int, ...] = SERVING_ONLY) -> Optional[CacheLocation]:
        """The fastest available location of a record among ``statuses``, or None."""
        best, best_off = None, 0
        for off in range(HEADER_LEN, HEADER_LEN + raw[22] * LOCATION_LEN, LOCATION_LEN):
            if raw[off] not in statuses:
                continue
            state = self._state(raw[off + 1])
            if state is not None and (best is None or state.backend.read_weight < best.backend.read_weight):
                best, best_off = state, off
        if best is None:
            return None
        off = best_off
        type_name, names, build = self.builder(best, raw[off + 1], raw[off + 2])
        uris = build(block_key, int.from_bytes(raw[off + 3:off + 8], "big"),
                     int.from_bytes(raw[off + 8:off + 14], "big"), int.from_bytes(raw[off + 14:off + 16], "big"))
        return cache_location(type_name, names, uris)

    def padding(self) -> CacheLocation:
        """A miss: every (filtered) spec with an empty URI."""
        names = [s.name for s in self._slots(0)]
        return cache_location(StorageType.ST_UNSPECIFIED.name, names, [""] * len(names))
