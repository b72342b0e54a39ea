"""Health tells the truth (issue 23 item 4, issue 28 item 15): a group whose only storage is
gone makes checkHealth, ``GET /api/healthy`` and the CLI say so, naming the group, the
storage and the reason; a refused read or write re-probes at once instead of waiting for the
next round; a full file storage is noticed by its probe and gets no new blocks."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from chalicelib.protocol.models import (
    BlockMask,
    FinishWriteCacheRequest,
    InstanceGroup,
    StartWriteCacheRequest,
    StorageConfig,
)
from chalicelib.storage.file import FreeSpace
from chalicelib.storage.registry import StorageRegistry
from chalicelib.workflows.health import REPROBE_INTERVAL_S
from tests.helpers import nfs_group_with_instance
from tests.integration.control.harness import call, code

SPECS = [{"name": "tp0", "size": 65536}]
MIB = 1 << 20


def setup_group(runtime, root: Path) -> None:
    nfs_group_with_instance(runtime, root, 1, SPECS)


def write(runtime, keys: list[int]) -> int:
    """Start and finish a write of ``keys``; returns how many were granted."""
    start = runtime.meta_service.start_write_cache(StartWriteCacheRequest(instance_id="i1", block_keys=keys))
    runtime.meta_service.finish_write_cache(
        FinishWriteCacheRequest(
            instance_id="i1",
            write_session_id=start.write_session_id,
            success_blocks=BlockMask(offset=len(start.locations)),
        )
    )
    return len(start.locations)


def read(client, keys: list[int]) -> dict:
    return call(client, "getCacheLocation", {"instance_id": "i1", "query_type": "QT_BATCH_GET", "block_keys": keys})


def healthy(client) -> tuple[int, str]:
    response = client.http.get("/api/healthy")
    return response.status_code, response.body.decode()


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "nfs"
    path.mkdir()
    return path


def test_a_group_whose_only_storage_is_gone_is_unhealthy_and_named(client, runtime, root, tmp_path):
    setup_group(runtime, root)
    assert runtime.health_checks.run_health_checks()["unavailable"] == []
    assert healthy(client) == (200, '{"status":"OK"}')
    data = call(client, "checkHealth")
    assert data["is_health"] is True and data["problems"] == [] and data["degraded_groups"] == []
    assert [(s["storage_unique_name"], s["status"]) for s in data["storages"]] == [("nfs_01", "HEALTHY")]

    root.rename(tmp_path / "moved")  # the operator's fault: the mount is gone
    report = runtime.health_checks.run_health_checks()  # one round confirms it (the clock is the test's)
    assert report["unavailable"] == ["nfs_01"]
    assert code(read(client, [1])) == "IO_ERROR"

    data = call(client, "checkHealth")
    assert data["is_health"] is False
    [storage] = data["storages"]
    assert (storage["storage_unique_name"], storage["status"]) == ("nfs_01", "UNAVAILABLE")
    assert "cannot write in" in storage["reason"] and str(root) in storage["reason"]
    [group] = data["degraded_groups"]
    assert (group["instance_group_name"], group["status"]) == ("g1", "NO_WRITABLE_STORAGE")
    assert group["reason"].startswith("nfs_01: UNAVAILABLE: storage nfs_01: cannot write in")
    assert data["problems"] == [f"instance group 'g1' has no storage to write to: {group['reason']}"]
    status, body = healthy(client)
    assert status == 503 and '"is_health":false' in body and "NO_WRITABLE_STORAGE" in body


def test_a_second_storage_keeps_the_group_writable_but_degraded(client, runtime, root, tmp_path):
    setup_group(runtime, root)
    backup = tmp_path / "backup"
    backup.mkdir()
    runtime.control.add_storage(
        StorageConfig.model_validate({"global_unique_name": "nfs_02", "nfs": {"root_path": str(backup)}})
    )
    group = runtime.control.get_group("g1")
    runtime.control.update_group(
        InstanceGroup.model_validate({**group.model_dump(), "version": 0, "storage_candidates": ["nfs_01", "nfs_02"]}),
        current_version=group.version,
    )
    shutil.rmtree(root)
    runtime.health_checks.run_health_checks()
    data = call(client, "checkHealth")
    assert data["is_health"] is True  # every group can still write
    [degraded] = data["degraded_groups"]
    assert (degraded["instance_group_name"], degraded["status"]) == ("g1", "DEGRADED")
    assert {s["storage_unique_name"]: s["status"] for s in data["storages"]} == {
        "nfs_01": "UNAVAILABLE",
        "nfs_02": "HEALTHY",
    }
    assert healthy(client)[0] == 200


def test_one_failed_probe_is_suspect_and_a_disabled_storage_is_named(client, runtime, root):
    setup_group(runtime, root)
    runtime.health_checks.run_health_checks()
    shutil.rmtree(root)
    runtime.health_checks.prober.probe(
        [runtime.storages.backend(runtime.control.get_storage("nfs_01").config)], 1.0, confirm=False
    )
    [storage] = call(client, "checkHealth")["storages"]
    assert storage["status"] == "SUSPECT" and "1 failed probe(s) in a row" in storage["reason"]
    assert call(client, "checkHealth")["is_health"] is True
    call(client, "disableStorage", {"storage_unique_name": "nfs_01"})
    data = call(client, "checkHealth")
    assert data["storages"][0]["status"] == "DISABLED" and data["is_health"] is False


def test_a_failing_read_reprobes_before_the_next_round(client, runtime, root, tmp_path, clock):
    """Detection and recovery no longer wait for the schedule: a read refused for want of a
    storage probes it at once (at most once per REPROBE_INTERVAL_S by all containers), and
    two good probes bring it back."""
    setup_group(runtime, root)
    assert write(runtime, [1]) == 1
    root.rename(tmp_path / "moved")
    runtime.health_checks.run_health_checks()
    assert code(read(client, [1])) == "IO_ERROR"

    (tmp_path / "moved").rename(root)  # restored: no scheduled round runs in this test from here
    clock.advance(REPROBE_INTERVAL_S)
    assert code(read(client, [1])) == "IO_ERROR"  # this refusal probed: one good probe of two
    assert code(read(client, [1])) == "IO_ERROR"  # within the interval: no probe
    assert call(client, "checkHealth")["storages"][0]["status"] == "UNAVAILABLE"
    clock.advance(REPROBE_INTERVAL_S)
    assert code(read(client, [1])) == "IO_ERROR"  # the second good probe flips it back...
    assert len(read(client, [1])["locations"]) == 1  # ...for the next request, in this container at once
    assert call(client, "checkHealth")["is_health"] is True


class Disk:
    """A free-space probe the test controls (for a machine where tmpfs cannot be mounted)."""

    def __init__(self) -> None:
        self.free = 100 * MIB

    def __call__(self, path: str) -> FreeSpace:
        assert os.path.isdir(path)
        return FreeSpace(self.free, 100 * MIB)


class Tmpfs:
    """A real 4 MiB tmpfs (root only), filled by a file: the probe's own statvfs sees it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)], capture_output=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {result.stderr.decode().strip()}")
        self.filler = root / "filler"

    @property
    def free(self) -> int:
        stat = os.statvfs(self.root)
        return stat.f_bavail * stat.f_frsize

    @free.setter
    def free(self, wanted: int) -> None:
        self.filler.unlink(missing_ok=True)
        try:
            with open(self.filler, "wb") as f:
                f.write(b"\0" * max(0, self.free - wanted))
        except OSError as exc:  # filling up to the last byte may meet ENOSPC: it is full then
            assert wanted == 0, exc

    def close(self) -> None:
        subprocess.run(["umount", str(self.root)], check=True)


@pytest.fixture(params=["statvfs-of-a-tmpfs", "injected"])
def disk(request, runtime, root):
    """The storage's free space, as the test sets it (``disk.free = ...``)."""
    if request.param == "injected":
        disk = Disk()
        runtime.__dict__["storages"] = StorageRegistry(lambda: runtime.valkey, min_free_bytes=MIB, free_space=disk)
        yield disk
        return
    disk = Tmpfs(root)
    try:
        runtime.__dict__["storages"] = StorageRegistry(lambda: runtime.valkey, min_free_bytes=MIB)
        yield disk
    finally:
        disk.close()


def test_a_full_file_storage_gets_no_new_blocks_and_keeps_serving(client, runtime, root, disk, clock):
    setup_group(runtime, root)
    assert write(runtime, [1, 2]) == 2
    disk.free = MIB // 2  # under the 1 MiB the storage keeps free
    runtime.health_checks.run_health_checks()

    data = call(client, "checkHealth")
    [storage] = data["storages"]
    assert storage["status"] == "FULL" and "under the 1.0 MiB it keeps free" in storage["reason"]
    assert data["is_health"] is False and data["degraded_groups"][0]["status"] == "NO_WRITABLE_STORAGE"
    refused = call(client, "startWriteCache", {"instance_id": "i1", "block_keys": [3, 4, 5]})
    assert (
        code(refused) == "REACH_MAX_ENTITY_CAPACITY"
        and "no available storage" in refused["header"]["status"]["message"]
    )
    assert len(read(client, [1, 2])["locations"]) == 2  # what is there is still served

    disk.free = 10 * MIB  # room again: refused starts re-probe it
    for _ in range(2):
        clock.advance(REPROBE_INTERVAL_S)
        call(client, "startWriteCache", {"instance_id": "i1", "block_keys": [6]})
    assert call(client, "checkHealth")["storages"][0]["status"] == "HEALTHY"
    assert write(runtime, [7]) == 1


def test_a_storage_out_of_space_fails_its_probe_write_as_full(runtime, root):
    """ENOSPC on the probe's own file: full, not merely unavailable."""
    disk = Tmpfs(root)
    try:
        disk.free = 0
        backend = StorageRegistry(lambda: runtime.valkey, min_free_bytes=0).backend(
            StorageConfig.model_validate({"global_unique_name": "nfs_01", "nfs": {"root_path": str(root)}})
        )
        from chalicelib.storage.health import probe_storage

        result = probe_storage(backend)
        assert (result.ok, result.full) == (False, True) and "No space left on device" in result.error
    finally:
        disk.close()
