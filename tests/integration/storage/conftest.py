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
def harness(request, make_harness) -> Harness:
    return make_harness(request.param)


@pytest.fixture
def make_harness(request, tmp_path, listening_port):
    """``make_harness(kind, copy=0)``: a healthy backend of ``kind``; each ``copy`` number
    is another storage of that kind (its own name, root or prefix)."""

    def make(kind: str, copy: int = 0) -> Harness:
        return _build(request, tmp_path / f"{kind}-{copy}", listening_port, kind, copy)

    return make


def _build(request, tmp_path, listening_port, kind: str, copy: int) -> Harness:
    suffix = f"{copy + 1:02d}"
    if kind.startswith("nfs"):
        root = tmp_path / "nfs"
        root.mkdir(parents=True)
        pack = 4 if kind == "nfs-packed" else 0
        return FileHarness(
            FileBackend(storage_config(f"nfs_{suffix}", "nfs", {"root_path": f"{root}/", "key_count_per_file": pack}))
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
            return FileHarness(ThreeFSBackend(storage_config(f"3fs_{suffix}", "threefs", spec)))
        spec.update(remote_host="10.1.1.1", remote_port=9000, key_count_per_file=1)
        return FileHarness(VcnsThreeFSBackend(storage_config(f"vcns_{suffix}", "vcnsthreefs", spec)))
    if kind == "s3":
        request.getfixturevalue("aws")
        bucket = f"kvcm-data-{suffix}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        return S3Harness(
            S3Backend(
                storage_config(f"s3_{suffix}", "s3", {"bucket": bucket, "prefix": "/kv/"}), lambda: boto3.client("s3")
            )
        )
    if kind == "mooncake":
        store = FakeMooncakeStore()
        cfg = storage_config(f"mc_{suffix}", "mooncake", {"master_service_entry": f"127.0.0.1:{listening_port}"})
        return MooncakeHarness(MooncakeBackend(cfg, store_factory=lambda: store), store)
    valkey = request.getfixturevalue("valkey")
    cfg = storage_config(
        f"pool_{suffix}",
        "tair_mem_pool",
        {"domain": f"127.0.0.1:{listening_port}", "capacity": 1 << 20, "timeout": 500},
    )
    return MemPoolHarness(TairMemPoolBackend(cfg, valkey), valkey)
