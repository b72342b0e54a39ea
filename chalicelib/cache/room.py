"""A start refused for a quota: make room in the writing instance and try again.

``RetryWithEviction`` is the whole policy, its limits in its fields. A start is first
tried all or nothing. Refused for the instance's quota, the group's, a storage type's or
the key cap, it asks the capacity layer (``MakeRoom``: write path eviction) to mark
victims in the instance for the shortfall, and tries again; when the instance could not
free the whole shortfall, that try is a partial grant: the longest leading run of the
keys that fits (docs/capacity.md, "Partial grants"). Concurrent writers may take the room
first: at most ``evictions`` rounds (``fruitless`` in a row marking nothing), then a last
partial try.

The victims are held, not handed to deletion, until the start is answered: a start that
ends granted hands them over (``MadeRoom.keep``); one that ends refused restores them
(``MadeRoom.undo``), so a refused start changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..index.errors import QuotaExceededError
from ..index.layout import StartRefusal

if TYPE_CHECKING:
    from ..index import StartOutcome

#: Refusals that freeing blocks of the instance can answer.
EVICTABLE = frozenset({StartRefusal.INSTANCE, StartRefusal.GROUP, StartRefusal.TYPE, StartRefusal.KEYS})


class MadeRoom(Protocol):
    """Victims one eviction marked, held until the start is answered."""

    @property
    def bytes(self) -> int:
        """Bytes marked (0: no room made)."""
        ...

    @property
    def enough(self) -> bool:
        """Whether the whole shortfall was freed."""
        ...

    def keep(self) -> None:
        """The start was granted: hand the victims to deletion."""
        ...

    def undo(self) -> None:
        """The start ends refused: the victims serve again."""
        ...


#: ``make_room(refusal, protected)``: marks victims for ``refusal``'s shortfall in the
#: writing instance, never one of ``protected`` (the write's own keys).
MakeRoom = Callable[[QuotaExceededError, frozenset[int]], MadeRoom]
#: ``attempt(partial)``: one start script call (partial: the longest leading run that fits).
Attempt = Callable[[bool], "StartOutcome"]


@dataclass(frozen=True)
class NoRoom:
    """What a service without write path eviction makes."""

    bytes: int = 0
    enough: bool = False

    def keep(self) -> None:
        """Nothing to hand over."""

    def undo(self) -> None:
        """Nothing to restore."""


@dataclass(frozen=True)
class RetryWithEviction:
    """How far a start refused for a quota goes to be granted."""

    #: Evictions per start, at most (concurrent writers may take the room first).
    evictions: int = 10
    #: Evictions in a row that marked nothing, after which only the last try is left.
    fruitless: int = 3

    def start(
        self, attempt: Attempt, make_room: MakeRoom, protected: frozenset[int], partial_allowed: bool = True
    ) -> StartOutcome:
        """The outcome of ``attempt`` after making room as needed; raises the last refusal
        (with every victim restored) when nothing can be granted. ``partial_allowed``
        False: a type refusal stays all or nothing (another candidate storage may take
        the whole write)."""
        rooms: list[MadeRoom] = []
        try:
            outcome = self._attempts(attempt, make_room, protected, partial_allowed, rooms)
        except BaseException:
            for room in rooms:
                room.undo()
            raise
        for room in rooms:
            room.keep()
        return outcome

    def _attempts(
        self,
        attempt: Attempt,
        make_room: MakeRoom,
        protected: frozenset[int],
        partial_allowed: bool,
        rooms: list[MadeRoom],
    ) -> StartOutcome:
        try:
            return attempt(False)
        except QuotaExceededError as refusal:
            if refusal.kind not in EVICTABLE:
                raise
            last = refusal
        fruitless = 0
        for _ in range(self.evictions):
            room = make_room(last, protected)
            rooms.append(room)
            # Nothing marked may still mean room: concurrent writers marked it first.
            fruitless = 0 if room.bytes else fruitless + 1
            if fruitless == self.fruitless:
                break
            # The instance could not free the whole shortfall: take what there is.
            partial = not room.enough and (partial_allowed or last.kind != StartRefusal.TYPE)
            try:
                return attempt(partial)
            except QuotaExceededError as refusal:
                if refusal.kind not in EVICTABLE:
                    raise
                last = refusal
        if not partial_allowed and last.kind == StartRefusal.TYPE:
            raise last
        return attempt(True)
