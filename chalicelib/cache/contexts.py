"""Builds InstanceContexts from the per-container config cache, reusing them while the
config objects they were built from are unchanged, for at most ``refresh_s`` (storage
health is re-read then)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..clock import Clock
from ..control.config_cache import ConfigCache
from ..control.records import InstanceRecord
from ..index import BlockIndex, InstanceLayout
from ..index.types import FIRST_BUCKET_BITS
from ..protocol.models import InstanceGroup, StorageConfig
from ..storage.base import StorageBackend
from ..storage.health import StorageHealth
from ..storage.health_store import StorageHealthStore
from ..storage.registry import StorageRegistry
from .context import InstanceContext, SpecLayout, StorageState


@dataclass
class _Entry:
    record: InstanceRecord
    group: InstanceGroup
    candidates: list[tuple[StorageConfig, bool]]
    until: float
    context: InstanceContext


class ContextProvider:
    """``provider(instance_id) -> InstanceContext``; raises InstanceNotFoundError."""

    def __init__(
        self,
        config: ConfigCache,
        registry: StorageRegistry,
        index: BlockIndex,
        health: StorageHealthStore,
        clock: Clock,
        refresh_s: float = 2.0,
    ) -> None:
        self._config = config
        self._health = health
        self._registry = registry
        self._index = index
        self._clock = clock
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._key_spaces: dict[tuple[str, str], InstanceLayout] = {}

    def __call__(self, instance_id: str) -> InstanceContext:
        record = self._config.instance(instance_id)
        group = self._config.group(record.group)
        candidates = self._config.storages_for_group(record.group)
        now = self._clock.now()
        entry = self._entries.get(instance_id)
        if (
            entry is not None
            and entry.record is record
            and entry.group is group
            and _same(entry.candidates, candidates)
            and now < entry.until
        ):
            return entry.context
        return self._build(record, group, candidates, now)

    def build(self, record: InstanceRecord) -> InstanceContext:
        """The context of ``record`` as it is, removing or not (removal, deletion tasks):
        the cache of lookups is bypassed."""
        return self._build(
            record,
            self._config.group(record.group),
            self._config.storages_for_group(record.group),
            self._clock.now(),
            cache=False,
        )

    def _build(
        self,
        record: InstanceRecord,
        group: InstanceGroup,
        candidates: list[tuple[StorageConfig, bool]],
        now: float,
        cache: bool = True,
    ) -> InstanceContext:
        instance_id = record.instance_id
        layout = self.key_space(record, group)
        out_of_service = self._health.out_of_service()
        context = InstanceContext(
            instance_id=instance_id,
            group=group,
            block_size=record.block_size,
            spec_layout=SpecLayout(tuple(record.location_spec_infos), tuple(record.location_spec_groups)),
            layout=layout,
            storages=tuple(
                _state(self._registry.backend(cfg), available, out_of_service.get(cfg.global_unique_name))
                for cfg, available in candidates
            ),
            other_backend=self.known_backend,
            block_key_scheme=record.block_key_scheme,
        )
        if cache:
            with self._lock:
                self._entries[instance_id] = _Entry(record, group, candidates, now + self._refresh_s, context)
        return context

    def known_backend(self, name: str) -> StorageBackend | None:
        """The backend of any storage in the control plane, candidate of the instance's group
        or not (blocks outlive group edits); None for a storage not there."""
        try:
            record = self._config.storage(name)
        except Exception:  # noqa: BLE001 - an unknown storage is simply not there
            return None
        return self._registry.backend(record.config)

    def key_space(
        self, record: InstanceRecord, group: InstanceGroup | None, registering: bool = False
    ) -> InstanceLayout:
        """The instance's key layout: its first bucket level and shards, fixed at its first use
        (shards: the group's ``instance_shards`` then, or when a registration takes the key
        space over) and kept in Valkey, where the key space is bound to the record's
        incarnation (``BlockIndex.claim``; docs/instance-sharding.md)."""
        key = (record.instance_id, record.incarnation)
        layout = self._key_spaces.get(key)
        if layout is None or registering:
            shards = max(1, group.instance_shards) if group is not None else 1
            # Buckets start few and grow with the records, not with the group's quota.
            layout = self._index.claim(
                record.instance_id, record.incarnation, FIRST_BUCKET_BITS, registering, shards, record.group
            )
            self._key_spaces[key] = layout
        return layout

    def expire(self) -> None:
        """Drop every cached context (storage health changed: rebuild from the store)."""
        with self._lock:
            self._entries.clear()

    def forget(self, instance_id: str) -> None:
        """Drop what is cached for an instance (after it is removed)."""
        with self._lock:
            self._entries.pop(instance_id, None)
            for key in [k for k in self._key_spaces if k[0] == instance_id]:
                del self._key_spaces[key]


def _state(backend: StorageBackend, enabled: bool, health: StorageHealth | None) -> StorageState:
    """A candidate as the hot path uses it: ``enabled`` by the operator, and out of service
    or not by the health checks (a full storage is read, not written)."""
    if health is None:
        return StorageState(backend, enabled)
    return StorageState(backend, enabled and health.readable, writable=False)


def _same(a: list[tuple[StorageConfig, bool]], b: list[tuple[StorageConfig, bool]]) -> bool:
    return len(a) == len(b) and all(x[0] is y[0] and x[1] == y[1] for x, y in zip(a, b, strict=True))
