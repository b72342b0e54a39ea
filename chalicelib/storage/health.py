"""Storage health: a probe that never raises, and availability with hysteresis.

``probe_storage`` runs a backend's probe under a deadline: a hung mount or a black-holed
endpoint must not hang the health check (the worker thread is abandoned, as a blocked
syscall cannot be interrupted). ``AvailabilityTracker`` turns a stream of probe results
into availability flips, so one lost probe does not take a storage out of service and
one lucky probe does not put a flapping one back.

A storage out of service is either unavailable (no reads, no writes) or, when its last
failed probe found it full (StorageFullError), full: its blocks are still served, and no
new block is placed on it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ..clock import Clock, SystemClock
from .base import StorageBackend, StorageFullError

DEFAULT_PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of one probe: ``error`` is empty when ``ok``; ``full`` when it failed
    because the storage is out of space."""

    ok: bool
    error: str = ""
    latency_ms: float = 0.0
    full: bool = False


def probe_storage(backend: StorageBackend, timeout_s: float = DEFAULT_PROBE_TIMEOUT_S) -> ProbeResult:
    """Probe ``backend`` within ``timeout_s``; any failure is reported, never raised."""
    outcome: list[Exception | None] = []

    def run() -> None:
        try:
            backend.probe()
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - a probe may fail in any way; the caller wants a result
            outcome.append(exc)

    started = time.perf_counter()
    worker = threading.Thread(target=run, name=f"kvcm-probe-{backend.name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    latency_ms = (time.perf_counter() - started) * 1000
    if not outcome:
        return ProbeResult(False, f"storage {backend.name}: probe timed out after {timeout_s:g} s", latency_ms)
    error = outcome[0]
    if error is None:
        return ProbeResult(True, "", latency_ms)
    return ProbeResult(False, str(error) or type(error).__name__, latency_ms, isinstance(error, StorageFullError))


@dataclass(frozen=True)
class AvailabilityChange:
    """A storage's availability flipped at ``at`` (clock seconds); ``reason`` is the last error."""

    storage: str
    available: bool
    at: float
    reason: str


@dataclass(frozen=True)
class StorageHealth:
    """What the tracker knows about one storage."""

    available: bool
    since: float
    #: Consecutive results that disagree with ``available`` (progress towards a flip).
    streak: int
    last_error: str
    last_latency_ms: float
    #: Out of service because full (reads still served), as the latest failed probe said.
    full: bool = False

    @property
    def readable(self) -> bool:
        """Whether the storage's blocks may be served (available, or only full)."""
        return self.available or self.full


class AvailabilityTracker:
    """Hysteresis over probe results, per storage; a pure state machine (no I/O).

    An unknown storage starts available (or as ``seed`` says). It becomes unavailable
    after ``fail_threshold`` consecutive failed probes and available again after
    ``recover_threshold`` consecutive good ones; a result that agrees with the current
    state resets the count. Thread-safe.
    """

    def __init__(self, fail_threshold: int = 2, recover_threshold: int = 2, clock: Clock | None = None) -> None:
        if fail_threshold < 1 or recover_threshold < 1:
            raise ValueError("thresholds must be >= 1")
        self.fail_threshold = fail_threshold
        self.recover_threshold = recover_threshold
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._states: dict[str, StorageHealth] = {}

    def _get(self, storage: str) -> StorageHealth:
        state = self._states.get(storage)
        if state is None:
            state = StorageHealth(True, self._clock.now(), 0, "", 0.0)
        return state

    def seed(self, storage: str, available: bool) -> None:
        """Start ``storage`` from a known state (e.g. persisted), with no streak."""
        with self._lock:
            self._states[storage] = StorageHealth(available, self._clock.now(), 0, "", 0.0)

    def restore(self, storage: str, state: StorageHealth) -> None:
        """Continue from a saved state, streak included (state shared between runs)."""
        with self._lock:
            self._states[storage] = state

    def forget(self, storage: str) -> None:
        """Drop a removed storage."""
        with self._lock:
            self._states.pop(storage, None)

    def status(self, storage: str) -> StorageHealth:
        """Current knowledge of ``storage`` (an unknown one is available)."""
        with self._lock:
            return self._get(storage)

    def is_available(self, storage: str) -> bool:
        """Whether ``storage`` should be used now."""
        return self.status(storage).available

    def observe(self, storage: str, result: ProbeResult) -> AvailabilityChange | None:
        """Feed one probe result; returns the change when availability flips, else None."""
        with self._lock:
            state = self._get(storage)
            error = "" if result.ok else result.error
            # Out of service, a storage is full as long as its failures say so (a full
            # storage whose mount then fails is no longer readable).
            full = not state.available and (state.full if result.ok else result.full)
            if result.ok == state.available:
                self._states[storage] = StorageHealth(state.available, state.since, 0, error, result.latency_ms, full)
                return None
            streak = state.streak + 1
            threshold = self.fail_threshold if state.available else self.recover_threshold
            if streak < threshold:
                self._states[storage] = StorageHealth(
                    state.available, state.since, streak, error, result.latency_ms, full
                )
                return None
            now = self._clock.now()
            self._states[storage] = StorageHealth(result.ok, now, 0, error, result.latency_ms, result.full)
            return AvailabilityChange(storage, result.ok, now, error)
