"""Per-container cache of the control plane for the hot path.

A data-plane call never reads DynamoDB when the cache is warm. At most once every
``refresh_s`` a call reads the config epoch (one Query; every control-plane write bumps
it in the same transaction); when it moved, everything cached is dropped and reloaded
on demand: storages and groups as one snapshot (two Queries), instances, accounts and API
keys one GetItem each.
So a change made in another container is seen within ``refresh_s``; a change made through
this container's ControlPlane is seen by the next call (the plane notifies the cache). The
service's log level (``updateLogger``) travels the same way: it is applied whenever the
catalog is loaded (``sync`` loads it for containers that make no lookups).

Unknown instances (accounts, keys) are cached too (as misses), until the next epoch change, so a client
polling with a bad id costs no DynamoDB reads. If DynamoDB cannot be reached at refresh
time, the cache keeps serving what it has and tries again after ``refresh_s``.

Returned records and models are shared: callers must not mutate them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..clock import Clock
from ..observability.logging import logger
from ..protocol.errors import InstanceNotFoundError, ServiceNotReadyError
from ..protocol.models import InstanceGroup, StorageConfig
from ..protocol.validation import require
from .api_keys import ApiKeyRecord
from .errors import UnknownEntityError
from .plane import ACCOUNT, API_KEY, INSTANCE, ControlPlane
from .records import AccountRecord, InstanceRecord, StorageRecord, candidate_storages

T = TypeVar("T")


@dataclass(frozen=True)
class _Catalog:
    """Storages, groups and service settings as of one load, with each group's candidate
    storages resolved."""

    storages: dict[str, StorageRecord]
    groups: dict[str, InstanceGroup]
    candidates: dict[str, list[tuple[StorageConfig, bool]]]
    log_level: str | None

    @classmethod
    def load(cls, control: ControlPlane) -> _Catalog:
        storages = {s.name: s for s in control.list_storages()}
        groups = {g.name: g for g in control.list_groups()}
        return cls(
            storages, groups, {name: candidate_storages(g, storages) for name, g in groups.items()}, control.log_level()
        )


class ConfigCache:
    """Version-refreshed, thread-safe cache of instances, groups and storages."""

    def __init__(
        self,
        control: ControlPlane,
        clock: Clock,
        refresh_s: float = 2.0,
        max_entries: int = 100_000,
        on_log_level: Callable[[str], None] = lambda level: None,
    ) -> None:
        self._control = control
        #: Applies the service's log level, when set, each time the catalog is loaded.
        self._on_log_level = on_log_level
        self._clock = clock
        self._refresh_s = refresh_s
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self._next_check = float("-inf")
        # Bumped whenever cached data is dropped, so a load that started before the drop
        # never stores its (possibly stale) result afterwards.
        self._generation = 0
        self._catalog: _Catalog | None = None
        self._entities: dict[tuple[str, str], Any] = {}
        control.add_listener(self._on_local_write)

    # ---------------------------------------------------------------- lookups

    def instance(self, instance_id: str) -> InstanceRecord:
        """The registered instance, or InstanceNotFoundError (INSTANCE_NOT_EXIST); an
        instance being removed does not exist any more."""
        require(instance_id, "instance_id")
        record = self._lookup(INSTANCE, instance_id, self._control.get_instance)
        if record is None or record.removing_us:
            raise InstanceNotFoundError(f"instance '{instance_id}' does not exist")
        return record

    def account(self, user_name: str) -> AccountRecord | None:
        """The account, or None (a deleted account is gone within ``refresh_s``)."""
        return self._lookup(ACCOUNT, user_name, self._control.get_account)

    def api_key(self, key_id: str, before_load: Callable[[], None] = lambda: None) -> ApiKeyRecord | None:
        """The API key's record, or None (a revoked key is gone within ``refresh_s``).
        ``before_load`` runs only when the table must be read (it may raise to refuse)."""

        def load(name: str) -> ApiKeyRecord | None:
            before_load()
            return self._control.get_api_key(name)

        return self._lookup(API_KEY, key_id, load)

    def _lookup(self, kind: str, name: str, load: Callable[[str], T | None]) -> T | None:
        """One entity from the cache, or loaded (hits and misses both cached until the
        next epoch change)."""
        generation = self._check()
        with self._lock:
            cached = (kind, name) in self._entities
            record = self._entities.get((kind, name))
        if not cached:
            record = load(name)
            with self._lock:
                if self._generation == generation:
                    if len(self._entities) >= self._max_entries:
                        self._entities.clear()  # bounded memory, whatever names clients send
                    self._entities[(kind, name)] = record
        return record

    def group(self, name: str) -> InstanceGroup:
        """The instance group (defaults filled in), or UnknownEntityError."""
        group = self._current().groups.get(name)
        if group is None:
            raise UnknownEntityError(f"instance group '{name}' does not exist")
        return group

    def storage(self, name: str) -> StorageRecord:
        """The storage with its availability, or UnknownEntityError."""
        record = self._current().storages.get(name)
        if record is None:
            raise UnknownEntityError(f"storage '{name}' does not exist")
        return record

    def storages_for_group(self, group: str) -> list[tuple[StorageConfig, bool]]:
        """The group's candidate storages that exist, in candidate order, with availability."""
        catalog = self._current()
        if group not in catalog.candidates:
            raise UnknownEntityError(f"instance group '{group}' does not exist")
        return list(catalog.candidates[group])

    def sync(self) -> None:
        """Bring the catalog up to date, and with it the service settings it applies, for
        a container that makes no lookups of its own (scheduled jobs)."""
        self._current()

    def invalidate(self) -> None:
        """Drop everything; the next lookup reloads (tests, or after an out-of-band change)."""
        with self._lock:
            self._drop()
            self._epoch = None
            self._next_check = float("-inf")

    # ---------------------------------------------------------------- refresh

    def _on_local_write(self) -> None:
        with self._lock:
            self._next_check = float("-inf")

    def _drop(self) -> None:
        self._catalog = None
        self._entities = {}
        self._generation += 1

    def _check(self) -> int:
        """Re-read the epoch if it is time; returns the generation the caller works in.

        The read happens under the lock: concurrent lookups in this container wait for
        that one small read instead of each issuing their own."""
        with self._lock:
            now = self._clock.now()
            if now < self._next_check:
                return self._generation
            self._next_check = now + self._refresh_s
            try:
                epoch = self._control.epoch()
            except ServiceNotReadyError:
                logger.warning("config epoch unreadable; serving cached control-plane data")
                return self._generation
            if epoch != self._epoch:
                self._epoch = epoch
                self._drop()
            return self._generation

    def _current(self) -> _Catalog:
        generation = self._check()
        catalog = self._catalog
        if catalog is None:
            catalog = _Catalog.load(self._control)
            with self._lock:
                if self._generation == generation:
                    self._catalog = catalog
            if catalog.log_level:
                self._on_log_level(catalog.log_level)
        return catalog
