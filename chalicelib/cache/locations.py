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


def _location_factory(type_name: str, names: list[str], build: UriBuilder) -> Callable[[int, int, int, int], CacheLocation]:
    count = len(names)

    def make(block_key: int, location_id: int, group_id: int, slot: int) -> CacheLocation:
        uris = build(block_key, location_id, group_id, slot)
        return {"type": type_name, "spec_size": count,
                "location_specs": [{"name": n, "uri": u} for n, u in zip(names, uris)]}

    return make


class LocationRenderer:
    """Renders the best location of records of one instance, filtered to ``spec_names``."""

    def __init__(self, ctx: InstanceContext, storage_name: Callable[[int], str],
                 spec_names: Optional[frozenset] = None) -> None:
        self._ctx = ctx
        self._storage_name = storage_name
        self._filter = spec_names
        self._states: dict[int, Optional[StorageState]] = {}
        self._builders: dict[tuple[int, int], Callable[[int, int, int, int], CacheLocation]] = {}

    def _slots(self, spec_group: int) -> tuple[SpecSlot, ...]:
        slots = self._ctx.spec_layout.slots(spec_group)
        return slots if self._filter is None else tuple(s for s in slots if s.name in self._filter)

    def _state(self, sidx: int) -> Optional[StorageState]:
        """The storage of an index if it may serve reads now, else None."""
        if sidx not in self._states:
            state = self._ctx.by_name.get(self._storage_name(sidx))
            self._states[sidx] = state if state is not None and state.available else None
        return self._states[sidx]

    def builder(self, state: StorageState, sidx: int, spec_group: int) -> Callable[[int, int, int, int], CacheLocation]:
        """``make(block_key, location_id, group_id, slot) -> CacheLocation`` for one storage
        and spec group, prepared once per request."""
        key = (sidx, spec_group)
        make = self._builders.get(key)
        if make is None:
            slots = self._slots(spec_group)
            make = _location_factory(state.storage_type.name, [s.name for s in slots],
                                     state.backend.uri_builder(self._ctx.instance_id, slots))
            self._builders[key] = make
        return make

    def location(self, block_key: int, raw: bytes, statuses: tuple[int, ...] = SERVING_ONLY) -> Optional[CacheLocation]:
        """The fastest available location of a record among ``statuses``, or None."""
        if raw[22] == 1:  # the usual record: one location
            off = HEADER_LEN
            best = self._state(raw[off + 1]) if raw[off] in statuses else None
        else:
            best, off = self._best(raw, statuses)
        if best is None:
            return None
        make = self.builder(best, raw[off + 1], raw[off + 2])
        return make(block_key, int.from_bytes(raw[off + 3:off + 8], "big"),
                    int.from_bytes(raw[off + 8:off + 14], "big"), (raw[off + 14] << 8) | raw[off + 15])

    def _best(self, raw: bytes, statuses: tuple[int, ...]) -> tuple[Optional[StorageState], int]:
        """Among replicas, the available storage with the lowest read weight."""
        best, best_off = None, 0
        for off in range(HEADER_LEN, HEADER_LEN + raw[22] * LOCATION_LEN, LOCATION_LEN):
            if raw[off] not in statuses:
                continue
            state = self._state(raw[off + 1])
            if state is not None and (best is None or state.backend.read_weight < best.backend.read_weight):
                best, best_off = state, off
        return best, best_off

    def padding(self) -> CacheLocation:
        """A miss: every (filtered) spec with an empty URI."""
        names = [s.name for s in self._slots(0)]
        return cache_location(StorageType.ST_UNSPECIFIED.name, names, [""] * len(names))
