"""What the hot path knows about an instance: its specs, group, storages and key layout,
assembled from the per-container config cache (no DynamoDB read per call)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from ..index import InstanceLayout
from ..protocol.block_keys import ROLLING, BlockKeyScheme
from ..protocol.codes import CachePreferStrategy, StorageType
from ..protocol.errors import InvalidArgumentError
from ..protocol.models import InstanceGroup, LocationSpecGroup, LocationSpecInfo
from ..storage.base import SpecSlot, StorageBackend


@dataclass(frozen=True)
class SpecLayout:
    """The instance's specs and spec groups; spec group 0 means every spec."""

    specs: tuple[LocationSpecInfo, ...]
    groups: tuple[LocationSpecGroup, ...]

    @cached_property
    def _slots(self) -> list[tuple[SpecSlot, ...]]:
        index = {s.name: i for i, s in enumerate(self.specs)}
        members = [list(range(len(self.specs)))]
        for group in self.groups:
            members.append(sorted(index[name] for name in group.spec_names if name in index))
        out = []
        for idxs in members:
            offset, slots = 0, []
            for i in idxs:
                slots.append(SpecSlot(self.specs[i].name, offset, self.specs[i].size))
                offset += self.specs[i].size
            out.append(tuple(slots))
        return out

    def slots(self, spec_group: int) -> tuple[SpecSlot, ...]:
        """The specs stored for blocks of ``spec_group``, with offsets inside the block."""
        return self._slots[spec_group] if spec_group < len(self._slots) else self._slots[0]

    @cached_property
    def sizes(self) -> list[int]:
        """Block bytes per spec group index."""
        return [sum(s.size for s in slots) for slots in self._slots]

    @cached_property
    def group_index(self) -> dict[str, int]:
        return {g.name: i + 1 for i, g in enumerate(self.groups)}

    def spec_groups_for(self, names: Sequence[str], count: int) -> list[int]:
        """Spec group index per key from ``location_spec_group_names`` (empty = all specs)."""
        if not names:
            return [0] * count
        if len(names) != count:
            raise InvalidArgumentError(f"field 'location_spec_group_names': {len(names)} names for {count} keys")
        try:
            return [self.group_index[n] for n in names]
        except KeyError as exc:
            raise InvalidArgumentError(
                f"field 'location_spec_group_names': unknown location spec group {exc.args[0]!r}"
            ) from None


@dataclass(frozen=True)
class StorageState:
    """A candidate storage of the group as the hot path sees it: ``available`` for reads
    (and writes), ``writable`` false when the health checks found it full."""

    backend: StorageBackend
    available: bool
    writable: bool = True

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def storage_type(self) -> StorageType:
        return self.backend.storage_type


_PREFERRED_TYPE = {
    CachePreferStrategy.CPS_ALWAYS_3FS: (StorageType.ST_3FS, True),
    CachePreferStrategy.CPS_PREFER_3FS: (StorageType.ST_3FS, False),
    CachePreferStrategy.CPS_ALWAYS_MOONCAKE: (StorageType.ST_MOONCAKE, True),
    CachePreferStrategy.CPS_PREFER_MOONCAKE: (StorageType.ST_MOONCAKE, False),
    CachePreferStrategy.CPS_ALWAYS_TAIR_MEMPOOL: (StorageType.ST_TAIRMEMPOOL, True),
    CachePreferStrategy.CPS_PREFER_TAIR_MEMPOOL: (StorageType.ST_TAIRMEMPOOL, False),
    CachePreferStrategy.CPS_ALWAYS_VCNS_3FS: (StorageType.ST_VCNS_3FS, True),
    CachePreferStrategy.CPS_PREFER_VCNS_3FS: (StorageType.ST_VCNS_3FS, False),
    CachePreferStrategy.CPS_ALWAYS_S3: (StorageType.ST_S3, True),
    CachePreferStrategy.CPS_PREFER_S3: (StorageType.ST_S3, False),
}


def tier_depths(group: InstanceGroup) -> dict[str, int]:
    """Each storage's tier in the group's migration routes (a route's source is hotter than
    its target): 0 for a storage no route copies into, else one more than the deepest
    source copying into it. A route that would close a cycle with the routes listed before
    it (a promote route back, B -> A after A -> B) does not reorder the tiers."""
    cache = group.cache_config
    config = cache.migration_config if cache is not None else None
    below: dict[str, set[str]] = {}  # storage -> the storages its routes reach, transitively
    edges: list[tuple[str, str]] = []
    for strategy in config.strategies if config is not None else ():
        source, target = strategy.source_storage_name, strategy.target_storage_name
        if source in below.get(target, ()):
            continue
        edges.append((source, target))
        reached = {target} | below.get(target, set())
        for under in below.values():
            if source in under:
                under |= reached
        below.setdefault(source, set()).update(reached)
    depths: dict[str, int] = {}
    for _ in edges:  # longest path in an acyclic graph: at most one pass per edge
        changed = False
        for source, target in edges:
            if depths.get(source, 0) + 1 > depths.get(target, 0):
                depths[target] = depths.get(source, 0) + 1
                changed = True
        if not changed:
            break
    return depths


def _no_backend(name: str) -> StorageBackend | None:
    """No storage but the candidates (a context built by hand)."""
    return None


@dataclass(frozen=True)
class InstanceContext:
    """One registered instance with its group's live configuration."""

    instance_id: str
    group: InstanceGroup
    block_size: int
    spec_layout: SpecLayout
    layout: InstanceLayout
    storages: tuple[StorageState, ...]
    #: The backend of a storage that is not a candidate (blocks outlive group edits), or None.
    other_backend: Callable[[str], StorageBackend | None] = _no_backend
    #: How the instance's ``token_ids`` become block keys.
    block_key_scheme: BlockKeyScheme = ROLLING

    @cached_property
    def by_name(self) -> dict[str, StorageState]:
        return {s.name: s for s in self.storages}

    @cached_property
    def servable(self) -> tuple[str, ...]:
        """Names of the storages whose blocks may be served now."""
        return tuple(s.name for s in self.storages if s.available)

    @cached_property
    def read_rank(self) -> dict[str, tuple[int, int, int]]:
        """Per candidate storage, its place when several copies of a block serve (lower
        first): its tier (``tier_depths``), then the backend's read weight within the tier,
        then its place in ``storage_candidates``."""
        depths = tier_depths(self.group)
        return {
            s.name: (depths.get(s.name, 0), s.backend.read_weight, position) for position, s in enumerate(self.storages)
        }

    def backend(self, name: str) -> StorageBackend | None:
        state = self.by_name.get(name)
        return state.backend if state is not None else self.other_backend(name)

    def write_candidates(self) -> list[StorageState]:
        """Candidate storages that take new blocks (not full), in the order the group's
        data_storage_strategy tries them."""
        strategy = CachePreferStrategy.CPS_UNSPECIFIED
        if self.group.cache_config is not None:
            strategy = self.group.cache_config.data_storage_strategy
        ordered = [s for s in self.storages if s.writable]
        if strategy in _PREFERRED_TYPE:
            wanted, only = _PREFERRED_TYPE[strategy]
            preferred = [s for s in ordered if s.storage_type == wanted]
            ordered = preferred if only else preferred + [s for s in ordered if s.storage_type != wanted]
        return ordered

    def type_capacity(self, storage_type: StorageType) -> int:
        """The group's quota for a storage type (0 = none)."""
        quota = self.group.quota
        if quota is None:
            return 0
        return next((q.capacity for q in quota.quota_config if q.storage_type == storage_type), 0)

    @property
    def group_capacity(self) -> int:
        return self.group.quota.capacity if self.group.quota is not None else 0

    @property
    def instance_capacity(self) -> int:
        """This instance's own byte quota (the group's ``instance_quotas``; 0 = none)."""
        return self.group.instance_quotas.get(self.instance_id, 0)

    @property
    def delete_delay_ms(self) -> int:
        """How long a location marked DELETING keeps its data (readers in flight finish)."""
        cache = self.group.cache_config
        strategy = cache.reclaim_strategy if cache is not None else None
        return strategy.delay_before_delete_ms if strategy is not None else 0

    @property
    def max_key_count(self) -> int:
        cache = self.group.cache_config
        if cache is None or cache.meta_indexer_config is None:
            return 0
        return cache.meta_indexer_config.max_key_count
