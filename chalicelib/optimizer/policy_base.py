"""The interface every simulated eviction policy implements (see ``policies``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar


class EvictionPolicy(ABC):
    """Base class: ``_entries`` holds the cached keys (membership is all the base needs)."""

    name: ClassVar[str]
    _entries: dict[int, Any]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> set[int]:
        """A snapshot of the cached keys."""
        return set(self._entries)

    def match_prefix(self, keys: Sequence[int]) -> int:
        """Length of the longest cached prefix of ``keys``."""
        entries = self._entries
        hits = 0
        for key in keys:
            if key not in entries:
                break
            hits += 1
        return hits

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

    #: Whether the replay must call :meth:`advance` with each record's time.
    timed: ClassVar[bool] = False
    #: Whether :meth:`insert` refreshes the cached keys it is given (then a request's read
    #: need not refresh them first).
    refresh_on_write: ClassVar[bool] = True
    #: Whether the capacity given is KVCM's limit, watermark applied by the policy itself
    #: (else a KVCM quota must leave room for the watermark).
    watermark_simulated: ClassVar[bool] = False

    def advance(self, timestamp_us: int) -> None:
        """Move the policy's clock to ``timestamp_us`` (timed policies only)."""
