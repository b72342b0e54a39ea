"""Injectable time. Everything with a TTL, deadline or backoff asks a Clock, so tests
advance time instead of sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` of this clock's time."""


class SystemClock:
    """Wall-clock time."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to (``advance``); ``sleep`` advances it."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


def now_us(clock: Clock) -> int:
    """The clock's time in integer microseconds."""
    return int(clock.now() * 1_000_000)


def now_ms(clock: Clock) -> int:
    """The clock's time in integer milliseconds."""
    return int(clock.now() * 1000)
