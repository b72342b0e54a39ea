"""Eviction policies over the blocks of one instance (cachetools-style classes).

Every policy sees the same three operations from the replay engine:

* ``match_prefix(keys)`` -- how many leading keys are cached (no state change);
* ``touch(keys)``        -- a read refreshes the cached keys among ``keys``;
* ``insert(keys, limit)`` -- a write stores ``keys`` (refreshing those already cached).

Both ``touch`` and ``insert`` visit the keys **last block first**, so a parent is never
less recent than its child: with LRU the cached set then stays prefix-closed, exactly as a
KVCM reclaimer that removes leaf blocks before their prefix parents.

``limit`` enforces a capacity *after every inserted block* (instance-precise mode);
``evict(n)`` removes ``n`` blocks at once (the rough, watermark-style modes). All randomness
comes from a ``random.Random(seed)`` owned by the policy: replays are reproducible.
"""

from __future__ import annotations

import heapq
import inspect
import random
from abc import abstractmethod
from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import repeat
from typing import Any

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.kvcm_policy import KVCMPolicy
from chalicelib.optimizer.policy_base import EvictionPolicy
from chalicelib.optimizer.radix import RadixIndex


class LRU(EvictionPolicy):
    """Least recently used, on an ``OrderedDict`` (C-level moves and pops)."""

    name = "lru"

    def __init__(self) -> None:
        self._entries: OrderedDict[int, None] = OrderedDict()

    def touch(self, keys: Sequence[int]) -> None:
        entries = self._entries
        move = entries.move_to_end
        for key in reversed(keys):
            if key in entries:
                move(key)

    def insert(self, keys: Sequence[int], limit: int | None = None, parent: int | None = None) -> int:
        entries = self._entries
        move = entries.move_to_end
        before = len(entries)
        for key in reversed(keys):
            if key in entries:
                move(key)
            else:
                entries[key] = None
        added = len(entries) - before
        # Evicting once after the whole write leaves the same blocks as evicting after each
        # insertion: either way the cache ends with the `limit` most recently touched keys,
        # and hits were counted before the write. Once is cheaper.
        if limit is not None and len(entries) > limit:
            self.evict(len(entries) - limit)
        return added

    def evict(self, count: int) -> int:
        entries = self._entries
        count = min(count, len(entries))
        if count > 0:
            victims = self._victims
            if victims is None:
                deque(map(entries.popitem, repeat(False, count)), 0)  # a C-level loop
            else:
                victims.extend(key for key, _ in map(entries.popitem, repeat(False, count)))
        return count


class _TickPolicy(EvictionPolicy):
    """Shared bookkeeping of policies that stamp each cached key with its last access tick."""

    def __init__(self) -> None:
        self._entries: dict[int, int] = {}
        self._tick = 0

    def touch(self, keys: Sequence[int]) -> None:
        entries, refresh = self._entries, self._refresh
        for key in reversed(keys):
            if key in entries:
                refresh(key)

    def insert(self, keys: Sequence[int], limit: int | None = None, parent: int | None = None) -> int:
        entries, refresh, add, evict = self._entries, self._refresh, self._add, self._evict_one
        added = len({key for key in keys if key not in entries})
        for index in range(len(keys) - 1, -1, -1):
            key = keys[index]
            if key in entries:
                refresh(key)
                continue
            add(key, keys[index - 1] if index else parent)
            if limit is not None and len(entries) > limit:
                evict()
        return added

    def evict(self, count: int) -> int:
        evicted = 0
        while evicted < count and self._entries:
            self._evict_one()
            evicted += 1
        return evicted

    def _refresh(self, key: int) -> None:
        self._tick += 1
        self._entries[key] = self._tick

    @abstractmethod
    def _add(self, key: int, parent: int | None) -> None:
        """Cache a new key (with the next tick)."""

    @abstractmethod
    def _evict_one(self) -> None:
        """Evict one block; only called while something is cached."""


class RandomLRU(_TickPolicy):
    """Sampled LRU (Redis-style): draw ``samples`` cached blocks at random, evict the least
    recently used of them. The draw uses the policy's own seeded RNG, so a replay with the
    same seed evicts the same blocks."""

    name = "random_lru"

    def __init__(self, seed: int = 0, samples: int = 5) -> None:
        super().__init__()
        if samples < 1:
            raise ConfigError(f"random_lru needs samples >= 1, got {samples}")
        self._rng = random.Random(seed)
        self._samples = samples
        self._slots: dict[int, int] = {}  # key -> index in _keys, for O(1) uniform draws
        self._keys: list[int] = []

    def _add(self, key: int, parent: int | None) -> None:
        self._slots[key] = len(self._keys)
        self._keys.append(key)
        self._refresh(key)

    def _evict_one(self) -> None:
        keys, entries = self._keys, self._entries
        victim = min(self._rng.choices(keys, k=self._samples), key=entries.__getitem__)
        slot = self._slots.pop(victim)
        last = keys.pop()
        if last != victim:
            keys[slot] = last
            self._slots[last] = slot
        del entries[victim]
        if self._victims is not None:
            self._victims.append(victim)


class LeafAwareLRU(_TickPolicy):
    """LRU over leaves only: evicts the least recently used cached block that has no cached
    child, so a prefix is never dropped while a longer prefix built on it is still cached.

    Leaves wait in a heap ordered by last access; entries are invalidated lazily (a stale
    tick, or a leaf that gained a child) and the heap is compacted when stale entries pile up.
    """

    name = "leaf_aware_lru"
    uses_parents = True

    def __init__(self) -> None:
        super().__init__()
        self._tree = RadixIndex()
        self._is_leaf = self._tree.is_leaf
        self._heap: list[tuple[int, int]] = []

    @property
    def tree(self) -> RadixIndex:
        """The radix index of the cached blocks (read-only use)."""
        return self._tree

    def _refresh(self, key: int) -> None:
        self._tick = tick = self._tick + 1
        self._entries[key] = tick
        if self._is_leaf(key):
            heapq.heappush(self._heap, (tick, key))

    def _add(self, key: int, parent: int | None) -> None:
        self._tree.add(key, parent)
        self._refresh(key)

    def _evict_one(self) -> None:
        heap, entries, is_leaf, pop = self._heap, self._entries, self._is_leaf, heapq.heappop
        while heap:
            tick, key = pop(heap)
            if entries.get(key) == tick and is_leaf(key):
                self._drop(key)
                return
        # No leaf at all: only possible when a trace breaks prefix chaining (a key seen
        # under two parents made a cycle). Fall back to plain LRU rather than overflow.
        self._drop(min(entries, key=entries.__getitem__))

    def _drop(self, key: int) -> None:
        entries, tree, heap = self._entries, self._tree, self._heap
        del entries[key]
        if self._victims is not None:
            self._victims.append(key)
        parent = tree.remove(key)
        if parent is not None and parent in entries and self._is_leaf(parent):
            heapq.heappush(heap, (entries[parent], parent))
        if len(heap) > 2 * len(entries) + 64:
            heap[:] = [(tick, k) for k, tick in entries.items() if tree.is_leaf(k)]
            heapq.heapify(heap)


class LFU(EvictionPolicy):
    """Least frequently used; among equally frequent blocks the least recently used goes
    first. Every touch counts (a read refresh and a write both add one)."""

    name = "lfu"

    def __init__(self) -> None:
        self._entries: dict[int, int] = {}  # key -> frequency
        self._buckets: dict[int, OrderedDict[int, None]] = {}  # frequency -> keys, LRU order
        self._min = 0

    def _bump(self, key: int) -> None:
        freq = self._entries[key]
        bucket = self._buckets[freq]
        del bucket[key]
        if not bucket:
            del self._buckets[freq]
            if self._min == freq:
                self._min = freq + 1
        self._entries[key] = freq + 1
        self._buckets.setdefault(freq + 1, OrderedDict())[key] = None

    def touch(self, keys: Sequence[int]) -> None:
        entries = self._entries
        for key in reversed(keys):
            if key in entries:
                self._bump(key)

    def insert(self, keys: Sequence[int], limit: int | None = None, parent: int | None = None) -> int:
        entries = self._entries
        added = len({key for key in keys if key not in entries})
        for key in reversed(keys):
            if key in entries:
                self._bump(key)
                continue
            entries[key] = 1
            self._buckets.setdefault(1, OrderedDict())[key] = None
            self._min = 1
            if limit is not None and len(entries) > limit:
                self.evict(1)
        return added

    def evict(self, count: int) -> int:
        entries, buckets = self._entries, self._buckets
        evicted = 0
        while evicted < count and entries:
            bucket = buckets[self._min]
            key, _ = bucket.popitem(last=False)
            del entries[key]
            if self._victims is not None:
                self._victims.append(key)
            if not bucket:
                del buckets[self._min]
                self._min = min(buckets) if buckets else 0
            evicted += 1
        return evicted


POLICIES: dict[str, type[EvictionPolicy]] = {cls.name: cls for cls in (LRU, RandomLRU, LeafAwareLRU, LFU, KVCMPolicy)}


def policy_name(name: str) -> str:
    """Canonical policy name (``Random-LRU`` -> ``random_lru``); raises on unknown names."""
    canonical = name.strip().lower().replace("-", "_")
    canonical = {"randomlru": "random_lru", "leafawarelru": "leaf_aware_lru", "leaf_aware": "leaf_aware_lru"}.get(
        canonical, canonical
    )
    if canonical not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return canonical


def make_policy(name: str, *, seed: int = 0, **params: Any) -> EvictionPolicy:
    """Build a policy by name. ``seed`` reaches policies that draw random numbers; other
    ``params`` (e.g. ``samples`` for ``random_lru``) must be accepted by the policy."""
    cls = POLICIES[policy_name(name)]
    accepted = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(f"policy {cls.name} does not take {', '.join(unknown)}")
    if "seed" in accepted:
        params["seed"] = seed
    return cls(**params)
