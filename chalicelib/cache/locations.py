"""Index records → wire CacheLocations, for one request at a time.

A response can carry hundreds of locations. Per (storage, spec group) the renderer
prepares once the JSON text of a whole location as a %-template (static text escaped,
the backend's URI placeholders left in) plus the function giving its arguments, so one
location costs one struct unpack and one %-format, and the response splices the texts in
(``protocol.wire.JsonArray``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from ..index import Status
from ..index.layout import HEADER, LOCATION
from ..protocol.codes import StorageType
from ..storage.base import SpecSlot, UriArgs, UriFormat
from .context import InstanceContext, StorageState

# Plain ints: the hot path compares raw status bytes with them.
SERVING_ONLY = (int(Status.SERVING),)
ANY_STATUS = (int(Status.WRITING), int(Status.SERVING), int(Status.DELETING))

#: A location in a record (index/layout.py): status, storage index, spec group, location id
#: (high 8 and low 32 bits), group id (high 16 and low 32 bits), slot.
_LOCATION = LOCATION.split
_FIRST_LOCATION, _LOCATION_LEN, _COUNT_AT = HEADER.size, LOCATION.size, HEADER.offset("location_count")
_STATUS_AT, _STORAGE_AT = LOCATION.offset("status"), LOCATION.offset("storage_index")

#: A location's JSON %-template and the function giving its arguments.
Prepared = tuple[str, UriArgs]


def _literal(value: str) -> str:
    """``value`` as a JSON string inside a %-template."""
    return json.dumps(value).replace("%", "%%")


def location_template(type_name: str, names: Sequence[str], formats: Sequence[UriFormat]) -> str:
    """The JSON of a CacheLocation as a %-template taking the URIs' arguments in order."""
    # A URI template's static text has its '%' doubled already, and JSON escaping never
    # adds or removes one: json.dumps of the template is the template of the JSON string.
    specs = ",".join(
        f'{{"name":{_literal(name)},"uri":{json.dumps(fmt.template)}}}'
        for name, fmt in zip(names, formats, strict=True)
    )
    return f'{{"type":{_literal(type_name)},"spec_size":{len(names)},"location_specs":[{specs}]}}'


def joined_args(formats: Sequence[UriFormat]) -> UriArgs:
    """The arguments of every URI of a location, in order."""
    if not formats:
        return _no_args
    first = formats[0].args
    if len(formats) == 1:
        return first
    rest = joined_args(formats[1:])

    def args(block_key: int, location_id: int, group_id: int, slot: int) -> tuple[int, ...]:
        return first(block_key, location_id, group_id, slot) + rest(block_key, location_id, group_id, slot)

    return args


def _no_args(block_key: int, location_id: int, group_id: int, slot: int) -> tuple[int, ...]:
    return ()


#: A storage's read rank (``InstanceContext.read_rank``) and its type.
Ranked = tuple[tuple[int, int, int], StorageType]
#: "Not ranked yet" in the renderer's cache, told apart by identity.
_UNRANKED: Ranked = ((0, 0, 0), StorageType.ST_UNSPECIFIED)

#: "Not prepared yet" in the renderer's cache, told apart by identity (a Prepared, so the
#: cache's lookups stay typed).
_UNKNOWN: Prepared = ("", _no_args)


class LocationRenderer:
    """Renders locations of one instance's records as JSON, filtered to ``spec_names``."""

    def __init__(
        self, ctx: InstanceContext, storage_name: Callable[[int], str], spec_names: frozenset[str] | None = None
    ) -> None:
        self._ctx = ctx
        self._storage_name = storage_name
        self._filter = spec_names
        self._states: dict[int, StorageState | None] = {}
        self._by_storage: dict[tuple[str, int], Prepared] = {}
        self._by_index: dict[tuple[int, int], Prepared | None] = {}
        self._ranks: dict[int, Ranked | None] = {}

    def _slots(self, spec_group: int) -> tuple[SpecSlot, ...]:
        slots = self._ctx.spec_layout.slots(spec_group)
        return slots if self._filter is None else tuple(s for s in slots if s.name in self._filter)

    def _state(self, sidx: int) -> StorageState | None:
        """The storage of an index if it may serve reads now, else None."""
        if sidx not in self._states:
            state = self._ctx.by_name.get(self._storage_name(sidx))
            self._states[sidx] = state if state is not None and state.available else None
        return self._states[sidx]

    def prepared(self, state: StorageState, spec_group: int) -> Prepared:
        """Template and arguments of locations on ``state`` for one spec group."""
        key = (state.name, spec_group)
        found = self._by_storage.get(key)
        if found is None:
            slots = self._slots(spec_group)
            formats = [state.backend.uri_format(self._ctx.instance_id, slot) for slot in slots]
            found = (location_template(state.storage_type.name, [s.name for s in slots], formats), joined_args(formats))
            self._by_storage[key] = found
        return found

    def _prepared_at(self, sidx: int, spec_group: int) -> Prepared | None:
        """Like ``prepared`` for a storage index; None when that storage may not serve now."""
        key = (sidx, spec_group)
        if key not in self._by_index:
            state = self._state(sidx)
            self._by_index[key] = self.prepared(state, spec_group) if state is not None else None
        return self._by_index[key]

    def render(
        self,
        block_key: int,
        raw: bytes,
        statuses: tuple[int, ...] = SERVING_ONLY,
        storage_type: StorageType | None = None,
    ) -> str | None:
        """JSON of the first-ranked available location of a record among ``statuses`` (and
        on a storage of ``storage_type`` when given), or None."""
        if raw[_COUNT_AT] == 1 and storage_type is None:  # the usual record: one location
            status, sidx, spec_group, id_hi, id_lo, group_hi, group_lo, slot = _LOCATION.unpack_from(
                raw, _FIRST_LOCATION
            )
            if status not in statuses:
                return None
            prepared = self._by_index.get((sidx, spec_group), _UNKNOWN)
            if prepared is _UNKNOWN:
                prepared = self._prepared_at(sidx, spec_group)
        else:
            offset = self._best(raw, statuses, storage_type)
            if offset is None:
                return None
            status, sidx, spec_group, id_hi, id_lo, group_hi, group_lo, slot = _LOCATION.unpack_from(raw, offset)
            prepared = self._prepared_at(sidx, spec_group)
        if prepared is None:
            return None
        template, args = prepared
        return template % args(block_key, (id_hi << 32) | id_lo, (group_hi << 32) | group_lo, slot)

    def render_each(self, block_key: int, raw: bytes) -> list[tuple[int, int, str | None]]:
        """Every location of a record in its order, as (status, location id, JSON), whatever
        the status and the storage's availability; the JSON is None when the storage is
        gone (getCacheMeta's replicas: a diagnostic view, not a read path)."""
        out: list[tuple[int, int, str | None]] = []
        for offset in range(_FIRST_LOCATION, _FIRST_LOCATION + raw[_COUNT_AT] * _LOCATION_LEN, _LOCATION_LEN):
            status, sidx, spec_group, id_hi, id_lo, group_hi, group_lo, slot = _LOCATION.unpack_from(raw, offset)
            location_id = (id_hi << 32) | id_lo
            state = self._ctx.by_name.get(self._storage_name(sidx))
            text = None
            if state is not None:
                template, args = self.prepared(state, spec_group)
                text = template % args(block_key, location_id, (group_hi << 32) | group_lo, slot)
            out.append((status, location_id, text))
        return out

    def _best(self, raw: bytes, statuses: tuple[int, ...], storage_type: StorageType | None) -> int | None:
        """Among replicas (of ``storage_type`` when given), the offset of the available one
        ranked first by the group's ``InstanceContext.read_rank`` (hottest tier, then lowest
        read weight)."""
        ranks = self._ranks
        best, best_offset = None, None
        for offset in range(_FIRST_LOCATION, _FIRST_LOCATION + raw[_COUNT_AT] * _LOCATION_LEN, _LOCATION_LEN):
            if raw[offset + _STATUS_AT] not in statuses:
                continue
            sidx = raw[offset + _STORAGE_AT]
            ranked = ranks.get(sidx, _UNRANKED)
            if ranked is _UNRANKED:
                ranked = ranks[sidx] = self._ranked(sidx)
            if ranked is None or (storage_type is not None and ranked[1] != storage_type):
                continue
            if best is None or ranked[0] < best:
                best, best_offset = ranked[0], offset
        return best_offset

    def _ranked(self, sidx: int) -> Ranked | None:
        """The read rank and type of the storage of an index; None when it may not serve now."""
        state = self._state(sidx)
        return (self._ctx.read_rank[state.name], state.storage_type) if state is not None else None

    def padding(self) -> str:
        """JSON of a miss: every (filtered) spec with an empty URI."""
        names = [s.name for s in self._slots(0)]
        empty = UriFormat("", _no_args)
        return location_template(StorageType.ST_UNSPECIFIED.name, names, [empty] * len(names)) % ()
