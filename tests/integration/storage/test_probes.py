"""Network probes against real sockets, probe_storage on real backends, registry wiring."""

import pytest

from chalicelib.storage import (
    FileBackend,
    MooncakeBackend,
    StorageRegistry,
    StorageUnavailableError,
    probe_storage,
)
from tests.helpers import free_port

from .harness import storage_config


def mooncake(entry):
    return MooncakeBackend(
        storage_config("mc_01", "mooncake", {"master_service_entry": entry}), store_factory=lambda: None
    )


def test_any_reachable_etcd_endpoint_is_enough(listening_port):
    mooncake(f"etcd://127.0.0.1:{free_port()};127.0.0.1:{listening_port}").probe()


def test_every_unreachable_endpoint_is_reported():
    first, second = free_port(), free_port()
    with pytest.raises(StorageUnavailableError) as info:
        mooncake(f"etcd://127.0.0.1:{first},127.0.0.1:{second}").probe()
    assert f"127.0.0.1:{first}" in str(info.value) and f"127.0.0.1:{second}" in str(info.value)


def test_probe_storage_reports_a_dead_mount(tmp_path):
    backend = FileBackend(storage_config("nfs_01", "nfs", {"root_path": str(tmp_path / "gone")}))
    result = probe_storage(backend)
    assert not result.ok and "nfs_01: cannot write in" in result.error and result.latency_ms >= 0
    assert probe_storage(FileBackend(storage_config("nfs_01", "nfs", {"root_path": str(tmp_path)}))).ok


def test_registry_pool_keys_share_one_hash_tag(valkey, listening_port):
    registry = StorageRegistry(lambda: valkey, key_prefix="kvcm-test")
    backend = registry.backend(
        storage_config("pool_9", "tair_mem_pool", {"domain": f"127.0.0.1:{listening_port}", "capacity": 4096})
    )
    backend.reserve("inst", 2, 100)
    keys = valkey.keys("*")
    assert keys and all(k.startswith(b"{kvcm-test:mp:pool_9}:") for k in keys)
    assert probe_storage(backend).ok
