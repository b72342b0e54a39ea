"""The interface every simulated eviction policy implements (see ``policies``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Sequence
from typing import Any, ClassVar


class EvictionPolicy(ABC):
    """Base class: ``_entries`` holds the cached keys (membership is all the base needs)."""

    name: ClassVar[str]
    _entries: dict[int, Any]
    #: Where evicted keys go when someone must know them (the tiered replay demotes them);
    #: None, the default, records nothing.
    _victims: list[int] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> set[int]:
        """A snapshot of the cached keys."""
        return set(self._entries)

    def membership(self) -> Container[int]:
        """The cached keys, live: ``key in`` it without a method call (read only)."""
        return self._entries

    def match_prefix(self, keys: Sequence[int]) -> int:
        """Length of the longest cached prefix of ``keys``."""
        entries = self._entries
        hits = 0
        for key in keys:
            if key not in entries:
                break
            hits += 1
        return hits

    def record_victims(self, sink: list[int]) -> None:
        """Append every key this policy evicts from now on to ``sink``."""
        self._victims = sink

    def hit(self, keys: Sequence[int], refresh: bool) -> None:
        """A read was served ``keys`` (all cached); ``refresh`` says whether it refreshes them.

        The replay calls this for every read with hits; a policy over several tiers
        (``tiered``) also credits and promotes the hits here."""
        if refresh:
            self.touch(keys)

    @abstractmethod
    def touch(self, keys: Sequence[int]) -> None:
        """Refresh the cached keys among ``keys`` (last first); uncached keys are ignored."""

    @abstractmethod
    def insert(self, keys: Sequence[int], limit: int | None = None, parent: int | None = None) -> int:
        """Store ``keys`` (a prefix chain whose first key hangs under ``parent``), last first.

        With ``limit`` set, at most ``limit`` blocks are cached after every inserted block.
        Returns how many distinct keys were not cached when the write began.
        """

    @abstractmethod
    def evict(self, count: int) -> int:
        """Evict up to ``count`` blocks in policy order; returns how many were evicted."""

    # ``timed`` and ``refresh_on_write`` are class defaults a composite may set per instance
    # (``tiered.TieredCache`` inherits them from its tiers).
    #: Whether the replay must call :meth:`advance` with each record's time.
    timed: bool = False
    #: Whether :meth:`insert` refreshes the cached keys it is given (then a request's read
    #: need not refresh them first).
    refresh_on_write: bool = True
    #: Whether :meth:`hit` does more than refresh (the replay may then skip the call).
    observes_hits: ClassVar[bool] = False
    #: Whether :meth:`insert` uses the parent links (a radix tree), or ignores them.
    uses_parents: ClassVar[bool] = False
    #: Whether the capacity given is KVCM's limit, watermark applied by the policy itself
    #: (else a KVCM quota must leave room for the watermark).
    watermark_simulated: ClassVar[bool] = False

    def advance(self, timestamp_us: int) -> None:
        """Move the policy's clock to ``timestamp_us`` (timed policies only)."""
