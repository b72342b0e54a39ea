"""Mooncake: client mode (injected or imported store) and owner-evicted mode."""

import sys
import types
from urllib.parse import parse_qs, urlsplit

import pytest

from chalicelib.protocol.models import StorageConfig
from chalicelib.storage.base import BlockRef, SpecSlot, StorageError
from chalicelib.storage.mooncake import MooncakeBackend
from tests.fakes.mooncake import FakeMooncakeStore

SPECS = (SpecSlot("tp0", 0, 512), SpecSlot("tp1", 512, 512))
CONFIG = StorageConfig.model_validate(
    {
        "global_unique_name": "mc_01",
        "mooncake": {
            "local_hostname": "kvcm-host",
            "metadata_connstring": "http://meta:8080/metadata",
            "protocol": "rdma",
            "rdma_device": "mlx5_0",
            "master_service_entry": "etcd://a:1;b:2",
        },
    }
)


def block(key=7, instance="inst_1", specs=SPECS):
    return BlockRef(instance, key, 100, 0, 0, specs)


@pytest.fixture
def store():
    return FakeMooncakeStore()


@pytest.fixture
def backend(store):
    return MooncakeBackend(CONFIG, store_factory=lambda: store)


@pytest.fixture
def no_mooncake(monkeypatch):
    """Make ``import mooncake.store`` fail, as on a host without the package."""
    monkeypatch.setitem(sys.modules, "mooncake", None)
    monkeypatch.setitem(sys.modules, "mooncake.store", None)


def test_uri_carries_encoded_key_and_size(backend):
    uri = backend.uri(block(instance="a b/c"), SPECS[1])
    parts = urlsplit(uri)
    assert (parts.scheme, parts.netloc, parts.path) == ("mooncake", "mc_01", "/")
    query = parse_qs(parts.query)
    assert query == {"key": ["a~20b~2Fc_tp1_0000000000000007"], "size": ["512"]}


def test_keys_of_different_instance_spec_splits_never_collide(backend):
    one = backend.key("a_b", "c", 1)
    two = backend.key("a", "b_c", 1)
    assert one != two
    assert one.rsplit("_", 2) == ["a_b", "c", "0000000000000001"]


def test_delete_removes_every_spec_and_is_idempotent(backend, store):
    for spec in SPECS:
        store.put(backend.key("inst_1", spec.name, 7), b"x")
    assert backend.exists(block())
    backend.delete([block()])
    assert store.objects == {} and not backend.exists(block())
    backend.delete([block()])  # OBJECT_NOT_FOUND is success


def test_exists_needs_every_spec(backend, store):
    store.put(backend.key("inst_1", "tp0", 7), b"x")
    assert not backend.exists(block())


def test_remove_failure_is_reported_after_trying_all(backend, store):
    keys = [backend.key("inst_1", spec.name, 7) for spec in SPECS]
    for key in keys:
        store.put(key, b"x")
    store.fail_codes[keys[0]] = -706  # OBJECT_HAS_LEASE: a reader still holds it
    with pytest.raises(StorageError, match="-706"):
        backend.delete([block()])
    assert keys[1] not in store.objects


def test_is_exist_error_raises(backend, store):
    store.fail_codes[backend.key("inst_1", "tp0", 7)] = -1
    with pytest.raises(StorageError, match="is_exist"):
        backend.exists(block())


def test_client_exceptions_become_storage_errors(store):
    def broken_remove(key):
        raise RuntimeError("transfer engine down")

    store.remove = broken_remove
    backend = MooncakeBackend(CONFIG, store_factory=lambda: store)
    with pytest.raises(StorageError, match="transfer engine down"):
        backend.delete([block()])


def test_store_is_set_up_once_lazily():
    made = []

    def factory():
        made.append(1)
        return FakeMooncakeStore()

    backend = MooncakeBackend(CONFIG, store_factory=factory)
    assert not backend.owner_evicted and made == []
    backend.exists(block())
    backend.delete([block()])
    assert made == [1]


def test_installed_package_is_set_up_from_the_spec(monkeypatch):
    setups = []

    class MooncakeDistributedStore(FakeMooncakeStore):
        def setup(self, *args):
            setups.append(args)
            return 0

    package = types.ModuleType("mooncake")
    module = types.ModuleType("mooncake.store")
    module.MooncakeDistributedStore = MooncakeDistributedStore
    package.store = module
    monkeypatch.setitem(sys.modules, "mooncake", package)
    monkeypatch.setitem(sys.modules, "mooncake.store", module)

    backend = MooncakeBackend(CONFIG)
    assert not backend.owner_evicted and setups == []
    backend.delete([block()])
    assert setups == [
        ("kvcm-host", "http://meta:8080/metadata", 0, 16 * 1024 * 1024, "rdma", "mlx5_0", "etcd://a:1;b:2")
    ]


def test_failed_setup_raises_and_is_retried(monkeypatch):
    codes = [-900, 0]

    class MooncakeDistributedStore(FakeMooncakeStore):
        def setup(self, *args):
            return codes.pop(0)

    module = types.ModuleType("mooncake.store")
    module.MooncakeDistributedStore = MooncakeDistributedStore
    monkeypatch.setitem(sys.modules, "mooncake", types.ModuleType("mooncake"))
    monkeypatch.setitem(sys.modules, "mooncake.store", module)
    backend = MooncakeBackend(CONFIG)
    with pytest.raises(StorageError, match="setup failed with code -900"):
        backend.delete([block()])
    backend.delete([block()])
    assert codes == []


def test_without_the_package_the_backend_is_owner_evicted(no_mooncake):
    backend = MooncakeBackend(CONFIG)
    assert backend.owner_evicted
    backend.delete([block()])  # nothing to do: Mooncake evicts its own data
    assert backend.exists(block())  # KVCM cannot see evictions; see the module docstring
    assert backend.uri(block(), SPECS[0]).startswith("mooncake://mc_01/?key=")
