"""checkHealth's verdict per storage and group (chalicelib.services.health), from control
records and probe states."""

from chalicelib.control.records import StorageRecord
from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.services.health import assess
from chalicelib.storage.health import StorageHealth


def record(name: str, enabled: bool = True) -> StorageRecord:
    return StorageRecord(StorageConfig(global_unique_name=name), enabled, 1)


def group(name: str, *candidates: str) -> InstanceGroup:
    return InstanceGroup(name=name, storage_candidates=list(candidates))


def state(available: bool, error: str = "", streak: int = 0, full: bool = False) -> StorageHealth:
    return StorageHealth(available, 100.0, streak, error, 1.0, full)


def test_each_state_and_its_reason():
    records = [record("ok"), record("sus"), record("down"), record("full"), record("off", enabled=False), record("new")]
    states = {
        "ok": state(True),
        "sus": state(True, "timeout", streak=1),
        "down": state(False, "mount gone"),
        "full": state(False, "full: 0.1 MiB free", full=True),
        "off": state(True),
    }
    storages, _ = assess(records, [], states)
    assert [(s.storage_unique_name, s.status) for s in storages] == [
        ("ok", "HEALTHY"),
        ("sus", "SUSPECT"),
        ("down", "UNAVAILABLE"),
        ("full", "FULL"),
        ("off", "DISABLED"),
        ("new", "NOT_CHECKED"),
    ]
    assert storages[2].reason == "mount gone" and storages[2].since_ms == 100_000
    assert storages[1].reason.startswith("timeout (1 failed probe(s) in a row")


def test_a_group_needs_one_writable_candidate():
    records = [record("a"), record("b"), record("c")]
    states = {"a": state(False, "mount gone"), "b": state(True), "c": state(False, "full", full=True)}
    groups = [group("one-left", "a", "b"), group("none-left", "a", "c", "ghost"), group("fine", "b"), group("events")]
    _, degraded = assess(records, groups, states)
    assert [(g.instance_group_name, g.status) for g in degraded] == [
        ("one-left", "DEGRADED"),
        ("none-left", "NO_WRITABLE_STORAGE"),
    ]
    assert degraded[1].reason == "a: UNAVAILABLE: mount gone; c: FULL: full; ghost: does not exist"
