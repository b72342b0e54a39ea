"""The storage contract's fixtures: every backend behind one ``harness`` (see ``harness``)."""

from __future__ import annotations

import socket

import boto3
import pytest

from chalicelib.storage import (
    FileBackend,
    MooncakeBackend,
    S3Backend,
    TairMemPoolBackend,
    ThreeFSBackend,
    VcnsThreeFSBackend,
)
from tests.fakes.mooncake import FakeMooncakeStore

from .harness import BACKEND_KINDS, FileHarness, Harness, MemPoolHarness, MooncakeHarness, S3Harness, storage_config


@pytest.fixture
def listening_port():
    """A loopback port that accepts TCP connections (the kernel backlog answers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


@pytest.fixture(params=BACKEND_KINDS)
def harness(request, tmp_path, listening_port) -> Harness:
    kind = request.param
    if kind.startswith("nfs"):
        root = tmp_path / "nfs"
        root.mkdir()
        pack = 4 if kind == "nfs-packed" else 0
        return FileHarness(
            FileBackend(storage_config("nfs_01", "nfs", {"root_path": f"{root}/", "key_count_per_file": pack}))
        )
    if kind in ("3fs", "vcns-3fs"):
        mount = tmp_path / "3fs"
        (mount / "kv" / "data").mkdir(parents=True)
        spec = {
            "mountpoint": str(mount),
            "root_dir": "kv/data/",
            "key_count_per_file": 2,
            "touch_file_when_create": True,
        }
        if kind == "3fs":
            return FileHarness(ThreeFSBackend(storage_config("3fs_01", "threefs", spec)))
        spec.update(remote_host="10.1.1.1", remote_port=9000, key_count_per_file=1)
        return FileHarness(VcnsThreeFSBackend(storage_config("vcns_01", "vcnsthreefs", spec)))
    if kind == "s3":
        request.getfixturevalue("aws")
        boto3.client("s3").create_bucket(Bucket="kvcm-data")
        return S3Harness(
            S3Backend(
                storage_config("s3_01", "s3", {"bucket": "kvcm-data", "prefix": "/kv/"}), lambda: boto3.client("s3")
            )
        )
    if kind == "mooncake":
        store = FakeMooncakeStore()
        cfg = storage_config("mc_01", "mooncake", {"master_service_entry": f"127.0.0.1:{listening_port}"})
        return MooncakeHarness(MooncakeBackend(cfg, store_factory=lambda: store), store)
    valkey = request.getfixturevalue("valkey")
    cfg = storage_config(
        "pool_01", "tair_mem_pool", {"domain": f"127.0.0.1:{listening_port}", "capacity": 1 << 20, "timeout": 500}
    )
    return MemPoolHarness(TairMemPoolBackend(cfg, valkey), valkey)
