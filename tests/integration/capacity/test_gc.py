"""The background GC on a real Valkey index, moto's control plane and file storages:
orphan WRITING locations past the grace and SERVING ones whose data is gone are deleted;
locations inside the grace, with an open session or whose probe cannot answer stay. The
scan rotates over the instances a page at a time, its position kept in Valkey."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from chalicelib.capacity import gc
from chalicelib.capacity.gc import CacheGarbageCollector, CacheGcConfigError
from chalicelib.index import Status
from chalicelib.index.records import decode_record
from chalicelib.index.types import MODE_RAW
from chalicelib.storage.file import FileBackend
from chalicelib.stores.gc_state import GcStateStore
from tests.integration.control.harness import call, code

BLOCK = 1024
HOUR = 3600


def storage(name: str, root: Path) -> dict:
    return {"global_unique_name": name, "nfs": {"root_path": str(root), "key_count_per_file": 1}}


def setup_instance(client, instance_id: str, group: str, storage_name: str) -> None:
    data = call(
        client,
        "registerInstance",
        {
            "instance_group": group,
            "instance_id": instance_id,
            "block_size": 16,
            "location_spec_infos": [{"name": "tp0", "size": BLOCK}],
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert code(data) == "OK", data


@pytest.fixture
def gc_setup(client, tmp_path):
    """Groups g1 (storage nfs1) and g2 (storage nfs2), an instance in each."""
    for name, group in (("nfs1", "g1"), ("nfs2", "g2")):
        assert code(call(client, "addStorage", {"storage": storage(name, tmp_path / name)})) == "OK"
        assert (
            code(call(client, "createInstanceGroup", {"instance_group": {"name": group, "storage_candidates": [name]}}))
            == "OK"
        )
    setup_instance(client, "i1", "g1", "nfs1")
    setup_instance(client, "i2", "g2", "nfs2")
    return tmp_path


def start(client, instance_id: str, keys: list[int]) -> dict:
    data = call(
        client, "startWriteCache", {"instance_id": instance_id, "block_keys": keys, "write_timeout_seconds": 60}
    )
    assert code(data) == "OK" and len(data["locations"]) == len(keys), data
    return data


def write_data(started: dict) -> list[Path]:
    """The engine's part: the blocks' bytes in their files."""
    paths = []
    for location in started["locations"]:
        for spec in location["location_specs"]:
            path = Path(urlsplit(spec["uri"]).path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * BLOCK)
            paths.append(path)
    return paths


def finish(client, instance_id: str, started: dict) -> None:
    data = call(
        client,
        "finishWriteCache",
        {
            "instance_id": instance_id,
            "write_session_id": started["write_session_id"],
            "success_blocks": {"offset": len(started["locations"])},
        },
    )
    assert code(data) == "OK", data


def lose_session(runtime, instance_id: str, started: dict) -> None:
    """The session is lost (a failover dropped it): its locations stay WRITING, unowned."""
    layout = runtime.contexts(instance_id).layout
    runtime.valkey.delete(layout.session(started["write_session_id"]))
    runtime.valkey.zrem(layout.key("sd"), started["write_session_id"])


def status(runtime, instance_id: str, key: int):
    (raw,) = runtime.index.read_raw(runtime.contexts(instance_id).layout, [key], MODE_RAW)
    return None if raw is None else decode_record(raw).locations[0].status


def test_orphans_past_the_grace_and_blocks_whose_data_is_gone_are_deleted(gc_setup, client, runtime, clock):
    old_orphan = start(client, "i1", [1, 2])
    lose_session(runtime, "i1", old_orphan)
    start(client, "i1", [3])  # its session stays open (the reaper never ran)
    served = start(client, "i1", [10, 11])
    files = write_data(served)
    finish(client, "i1", served)
    unknown = start(client, "i2", [20])
    write_data(unknown)
    finish(client, "i2", unknown)
    clock.advance(23 * HOUR)
    young_orphan = start(client, "i1", [4])
    lose_session(runtime, "i1", young_orphan)
    clock.advance(2 * HOUR)  # the first orphan is 25 h old, the second 2 h
    files[0].unlink()  # block 10's data is gone; block 11's is there
    shutil.rmtree(gc_setup / "nfs2")  # nfs2's data root is gone: its probe cannot answer
    atimes = {
        k: decode_record(raw).last_access_s
        for k, raw in zip(
            [10, 11], runtime.index.read_raw(runtime.contexts("i1").layout, [10, 11], MODE_RAW), strict=True
        )
    }

    report = runtime.cache_gc.run()

    assert report["round_finished"] and report["visits"] == ["i1", "i2"]
    assert report["candidates"] == {"orphan_writing": 2, "storage_missing": 1}
    assert [status(runtime, "i1", k) for k in (1, 2, 3, 4)] == [None, None, Status.WRITING, Status.WRITING]
    assert (status(runtime, "i1", 10), status(runtime, "i1", 11)) == (None, Status.SERVING)
    assert status(runtime, "i2", 20) == Status.SERVING
    (raw,) = runtime.index.read_raw(runtime.contexts("i1").layout, [11], MODE_RAW)
    assert decode_record(raw).last_access_s == atimes[11]  # the scan touches nothing
    assert runtime.index.usage([runtime.contexts("i1").layout])[0].keys == 3
    metric = runtime.metrics.value
    assert metric("cache_gc.candidate_count", {"reason": "orphan_writing"}) == 2
    assert metric("cache_gc.candidate_count", {"reason": "storage_missing"}) == 1
    assert metric("cache_gc.candidate_dropped_count", {"reason": "orphan_writing", "cause": "session_open"}) == 1
    assert metric("cache_gc.delete_target_count") == 3
    assert metric("cache_gc.storage_probe_count", {"result": "unknown"}) == 1
    assert metric("cache_gc.scan_key_count") == 7 and metric("cache_gc.scan_round_count") == 1
    assert metric("cache_gc.round_duration_ms") == 0  # one run: the clock did not move
    assert runtime.cache_gc.run()["skipped"].startswith("pausing after a round")


def test_the_scan_rotates_over_the_instances_and_resumes_on_another_node(
    gc_setup, client, runtime, other_container, clock, monkeypatch
):
    monkeypatch.setattr(gc, "PAGES_PER_RUN", 1)
    setup_instance(client, "i3", "g1", "nfs1")
    missing = start(client, "i3", [30])
    finish(client, "i3", missing)
    (gc_setup / "nfs1").mkdir(exist_ok=True)  # the storage is mounted; the block was never written there
    first = runtime.cache_gc.run()
    assert first["visits"] == ["i1"] and not first["round_finished"]
    runtime.lease.release()  # the next run happens on another node
    second = other_container.cache_gc.run()
    assert second["visits"] == ["i3"] and second["candidates"]["storage_missing"] == 1
    assert status(runtime, "i3", 30) is None
    clock.advance(60)
    third = other_container.cache_gc.run()
    assert third["visits"] == ["i2"] and third["round_finished"]
    assert other_container.metrics.value("cache_gc.round_duration_ms") == 60_000
    assert other_container.cache_gc.run()["skipped"].startswith("pausing")
    clock.advance(2 * HOUR)
    assert other_container.cache_gc.run()["visits"] == ["i1"]  # a new round, from the start


def test_only_the_lease_holder_collects(gc_setup, runtime, other_container):
    assert runtime.cache_gc.run()["round_finished"]
    assert other_container.cache_gc.run()["skipped"] == "another node holds the background lease"


def test_a_grace_shorter_than_an_hour_or_a_write_session_is_refused(runtime):
    state = GcStateStore(runtime.valkey, "x")
    for grace, longest in ((HOUR - 1, 0), (2 * HOUR, 3 * HOUR)):
        with pytest.raises(CacheGcConfigError, match="KVCM_CACHE_GC_ORPHAN_GRACE_S"):
            CacheGarbageCollector(
                runtime.lease,
                runtime.control,
                runtime.index,
                runtime.contexts,
                runtime.deleter,
                state,
                runtime.clock,
                runtime.metrics,
                orphan_grace_s=grace,
                round_pause_s=0,
                longest_session_s=longest,
            )


def test_switched_off_it_does_nothing(gc_setup, client, runtime):
    served = start(client, "i1", [10])
    finish(client, "i1", served)
    (gc_setup / "nfs1").mkdir(exist_ok=True)  # mounted, the block never written: missing
    runtime.reconfigure(cache_gc=False)
    assert runtime.cache_gc.run()["skipped"].startswith("the background GC is switched off")
    assert status(runtime, "i1", 10) == Status.SERVING


def test_probes_go_per_storage_in_bounded_chunks(gc_setup, client, runtime, monkeypatch):
    monkeypatch.setattr(gc, "PROBE_CHUNK", 2)
    served = start(client, "i1", [10, 11, 12, 13, 14])
    write_data(served)
    finish(client, "i1", served)
    probe = FileBackend.might_exist
    chunks: list[int] = []

    def counted(backend, blocks):
        chunks.append(len(blocks))
        return probe(backend, blocks)

    monkeypatch.setattr(FileBackend, "might_exist", counted)
    report = runtime.cache_gc.run()
    assert chunks == [2, 2, 1] and report["candidates"]["storage_missing"] == 0
    assert runtime.metrics.value("cache_gc.storage_probe_count", {"result": "present"}) == 5
