"""Per-container cache of the control plane for the hot path.

A data-plane call never reads DynamoDB when the cache is warm. At most once every
``refresh_s`` a call reads the config epoch (one Query; every control-plane write bumps
it in the same transaction that records what it changed). When the epoch moved, the cache
reads the change records since its last look (one more Query) and drops only what they
name: the instances, accounts and API keys changed, and the catalog (storages, groups,
settings) only when one of those changed. So one tenant's registrations or account
changes cost other tenants nothing but those two small Queries per refresh.
If the records do not account for every epoch step (the cache looked longer ago than they
are kept, or a record was missed), everything is revalidated: cached records are kept as
stale and re-read on their next use (a known API key is re-read, never refused as an
unknown one), the catalog reloads.
Storages and groups load as one snapshot (two Queries), instances, accounts and API keys
one GetItem each. A change made in another container is seen within ``refresh_s``; a
change made through this container's ControlPlane is seen by the next call (the plane
notifies the cache). The service's log level (``updateLogger``) travels the same way: it
is applied whenever the catalog is loaded (``sync`` loads it for containers that make no
lookups).

Unknown instances (accounts, keys) are cached too (as misses, in a bounded map of their
own, so a flood of random names never evicts known records), until a change names them,
so a client polling with a bad id costs no DynamoDB reads. If DynamoDB cannot be reached
at refresh time, the cache keeps serving what it has and tries again after ``refresh_s``.

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
from .table import Change

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


#: Kinds of entity cached one by one; a change to any other item drops the catalog.
_ENTITY_KINDS = frozenset({INSTANCE, ACCOUNT, API_KEY})
#: How far before its last look a cache reads change records again: covers writers' clock
#: skew and a transaction committed a while after its record's time (retries).
_CHANGE_OVERLAP_S = 10.0


class ConfigCache:
    """Version-refreshed, thread-safe cache of instances, groups, storages, accounts and keys."""

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
        self._misses: set[tuple[str, str]] = set()
        # Records kept through a full revalidation: re-read on next use, without the load gate.
        self._stale: dict[tuple[str, str], Any] = {}
        # Change records: those applied (by sort key, within the overlap), how many since
        # ``_base_epoch``, and from when the next look reads them.
        self._applied: dict[str, int] = {}
        self._applied_count = 0
        self._base_epoch = 0
        self._changes_from_us = 0
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
        ``before_load`` runs only when the table must be read for a key id this cache has
        never known (it may raise to refuse); a known key being revalidated skips it."""
        return self._lookup(API_KEY, key_id, self._control.get_api_key, before_load)

    def _lookup(
        self, kind: str, name: str, load: Callable[[str], T | None], gate: Callable[[], None] = lambda: None
    ) -> T | None:
        """One entity from the cache, or loaded (hits and misses both cached until a
        change names them)."""
        generation = self._check()
        entity = (kind, name)
        with self._lock:
            if entity in self._entities:
                return self._entities[entity]  # type: ignore[no-any-return]
            if entity in self._misses:
                return None
            known = entity in self._stale
        if not known:
            gate()
        record = load(name)
        with self._lock:
            if self._generation == generation:
                self._stale.pop(entity, None)
                if record is None:
                    if len(self._misses) >= self._max_entries:
                        self._misses.clear()  # bounded memory, whatever names clients send
                    self._misses.add(entity)
                else:
                    if len(self._entities) >= self._max_entries:
                        self._entities.clear()
                    self._entities[entity] = record
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
            self._catalog = None
            self._entities, self._misses, self._stale = {}, set(), {}
            self._generation += 1
            self._epoch = None
            self._next_check = float("-inf")

    # ---------------------------------------------------------------- refresh

    def _on_local_write(self) -> None:
        with self._lock:
            self._next_check = float("-inf")

    def _revalidate_all(self) -> None:
        """Keep known records as stale (re-read on next use), forget misses and the catalog."""
        self._stale.update(self._entities)
        self._entities, self._misses = {}, set()
        self._catalog = None
        self._generation += 1

    def _apply(self, changes: list[Change]) -> None:
        """Drop what ``changes`` name (those not applied yet)."""
        fresh = [change for change in changes if change.sort_key not in self._applied]
        for change in fresh:
            self._applied[change.sort_key] = change.at_us
            for entity in change.entities:
                kind, _, name = entity.partition("/")
                if kind in _ENTITY_KINDS:
                    self._entities.pop((kind, name), None)
                    self._misses.discard((kind, name))
                    self._stale.pop((kind, name), None)
                else:
                    self._catalog = None
        self._applied_count += len(fresh)
        if fresh:
            self._generation += 1

    def _follow(self, epoch: int, now: float) -> None:
        """The epoch moved from ``self._epoch`` to ``epoch``: drop what changed."""
        overlap_us = int(_CHANGE_OVERLAP_S * 1e6)
        if self._epoch is None:
            # Records of writes this first look already sees: never applied again later.
            seen = self._control.changes_since(int(now * 1e6) - overlap_us)
            self._applied = {change.sort_key: change.at_us for change in seen}
        else:
            self._apply(self._control.changes_since(self._changes_from_us - overlap_us))
        if self._epoch is None or self._applied_count < epoch - self._base_epoch:
            # A first look, or some writes left no record we read: trust nothing held.
            self._revalidate_all()
            self._base_epoch, self._applied_count = epoch, 0
        self._changes_from_us = int(now * 1e6)
        self._applied = {k: at for k, at in self._applied.items() if at >= self._changes_from_us - overlap_us}
        self._epoch = epoch

    def _check(self) -> int:
        """Re-read the epoch if it is time; returns the generation the caller works in.

        The reads happen under the lock: concurrent lookups in this container wait for
        those small reads instead of each issuing their own."""
        with self._lock:
            now = self._clock.now()
            if now < self._next_check:
                return self._generation
            self._next_check = now + self._refresh_s
            try:
                epoch = self._control.epoch()
                if epoch != self._epoch:
                    self._follow(epoch, now)
            except ServiceNotReadyError:
                logger.warning("config epoch unreadable; serving cached control-plane data")
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
