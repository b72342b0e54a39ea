"""probe_storage never raises; AvailabilityTracker flips with hysteresis."""

import threading

import pytest

from chalicelib.protocol.models import StorageConfig
from chalicelib.storage.base import BlockRef, SpecSlot, StorageBackend, StorageUnavailableError, UriFormat
from chalicelib.storage.health import AvailabilityChange, AvailabilityTracker, ProbeResult, probe_storage

OK = ProbeResult(True, "", 1.0)
FAIL = ProbeResult(False, "mount gone", 2.0)


class ScriptedBackend(StorageBackend):
    """A backend whose probe runs a given callable."""

    def __init__(self, probe):
        super().__init__(StorageConfig(global_unique_name="scripted"))
        self._probe = probe

    def uri_format(self, instance_id: str, spec: SpecSlot) -> UriFormat:
        return UriFormat("test://scripted/%d", lambda block_key, location_id, group_id, slot: (block_key,))

    def delete(self, blocks) -> None:
        pass

    def exists(self, block: BlockRef) -> bool:
        return False

    def probe(self) -> None:
        self._probe()


def _raise(exc):
    def probe():
        raise exc

    return probe


def test_probe_success_reports_latency():
    result = probe_storage(ScriptedBackend(lambda: None))
    assert result.ok and result.error == "" and result.latency_ms >= 0


@pytest.mark.parametrize(
    "exc, text",
    [
        (StorageUnavailableError("storage x: cannot write"), "storage x: cannot write"),
        (RuntimeError("boom"), "boom"),
        (KeyError(), "KeyError"),
    ],
)
def test_probe_failure_is_reported_not_raised(exc, text):
    result = probe_storage(ScriptedBackend(_raise(exc)))
    assert not result.ok and result.error == text


def test_hung_probe_times_out():
    release = threading.Event()
    try:
        result = probe_storage(ScriptedBackend(lambda: release.wait(10)), timeout_s=0.05)
        assert not result.ok and "timed out" in result.error
        assert 40 <= result.latency_ms < 5000
    finally:
        release.set()


def test_unknown_storage_is_available(clock):
    tracker = AvailabilityTracker(clock=clock)
    assert tracker.is_available("s1")
    assert tracker.status("s1").streak == 0


def test_flips_down_after_fail_threshold_and_back_after_recover_threshold(clock):
    tracker = AvailabilityTracker(fail_threshold=2, recover_threshold=3, clock=clock)
    assert tracker.observe("s1", FAIL) is None
    assert tracker.is_available("s1") and tracker.status("s1").streak == 1
    clock.advance(5)
    change = tracker.observe("s1", FAIL)
    assert change == AvailabilityChange("s1", False, clock.now(), "mount gone")
    assert not tracker.is_available("s1")
    assert tracker.observe("s1", FAIL) is None  # already down: no second change
    assert tracker.observe("s1", OK) is None
    assert tracker.observe("s1", OK) is None
    clock.advance(7)
    change = tracker.observe("s1", OK)
    assert change == AvailabilityChange("s1", True, clock.now(), "")
    status = tracker.status("s1")
    assert status.available and status.since == clock.now() and status.streak == 0


def test_a_contrary_result_resets_the_streak(clock):
    tracker = AvailabilityTracker(fail_threshold=2, recover_threshold=2, clock=clock)
    for _ in range(5):
        assert tracker.observe("s1", FAIL) is None
        assert tracker.observe("s1", OK) is None  # alternating never reaches two in a row
    assert tracker.is_available("s1")


def test_storages_are_tracked_independently(clock):
    tracker = AvailabilityTracker(fail_threshold=1, clock=clock)
    assert tracker.observe("a", FAIL).available is False
    assert tracker.is_available("b")


def test_seed_and_forget(clock):
    tracker = AvailabilityTracker(recover_threshold=1, clock=clock)
    tracker.seed("s1", False)
    assert not tracker.is_available("s1")
    assert tracker.observe("s1", OK).available is True
    tracker.seed("s1", False)
    tracker.forget("s1")
    assert tracker.is_available("s1")


def test_restore_continues_a_saved_streak(clock):
    first_run = AvailabilityTracker(fail_threshold=2, clock=clock)
    first_run.observe("s1", FAIL)
    saved = first_run.status("s1")
    next_run = AvailabilityTracker(fail_threshold=2, clock=clock)
    next_run.restore("s1", saved)
    assert next_run.observe("s1", FAIL).available is False, "the second failure in a row flips"


def test_status_keeps_last_error_and_latency(clock):
    tracker = AvailabilityTracker(clock=clock)
    tracker.observe("s1", FAIL)
    assert tracker.status("s1").last_error == "mount gone"
    assert tracker.status("s1").last_latency_ms == 2.0
    tracker.observe("s1", OK)
    assert tracker.status("s1").last_error == ""


@pytest.mark.parametrize("fail, recover", [(0, 1), (1, 0)])
def test_thresholds_must_be_positive(fail, recover):
    with pytest.raises(ValueError):
        AvailabilityTracker(fail, recover)


FULL = ProbeResult(False, "storage s: full", 1.0, full=True)


def test_a_full_storage_is_out_of_service_but_readable_until_its_mount_fails():
    tracker = AvailabilityTracker(fail_threshold=2, recover_threshold=2)
    tracker.observe("s", FULL)
    assert tracker.observe("s", FULL) is not None
    state = tracker.status("s")
    assert (state.available, state.full, state.readable) == (False, True, True)
    tracker.observe("s", FAIL)  # the mount went away too: no longer readable
    assert (tracker.status("s").full, tracker.status("s").readable) == (False, False)
    tracker.observe("s", FULL)
    tracker.observe("s", OK)  # one good probe: still out of service, still full
    assert (tracker.status("s").available, tracker.status("s").full) == (False, True)
    tracker.observe("s", OK)
    assert (tracker.status("s").available, tracker.status("s").full) == (True, False)


def test_probe_storage_reports_a_full_storage_as_full():
    from chalicelib.storage.base import StorageFullError

    def probe():
        raise StorageFullError("storage scripted: full")

    result = probe_storage(ScriptedBackend(probe))
    assert (result.ok, result.full, result.error) == (False, True, "storage scripted: full")
    assert probe_storage(ScriptedBackend(lambda: None)).full is False
