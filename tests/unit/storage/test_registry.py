"""StorageRegistry: validation names the field; backends are built per config version."""

import pytest
import redis

from chalicelib.protocol.codes import StorageType
from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.protocol.models import StorageConfig
from chalicelib.storage import (
    FileBackend,
    MooncakeBackend,
    S3Backend,
    StorageRegistry,
    TairMemPoolBackend,
    ThreeFSBackend,
    VcnsThreeFSBackend,
)
from chalicelib.storage.registry import sdk_entry

VALID = {
    "nfs": {"root_path": "/mnt/nfs/", "key_count_per_file": 8},
    "threefs": {"mountpoint": "/3fs", "root_dir": "kv/", "touch_file_when_create": True},
    "vcnsthreefs": {
        "mountpoint": "/3fs",
        "root_dir": "kv",
        "remote_host": "10.0.0.1",
        "remote_port": 8000,
        "meta_storage_uri": "meta://x",
    },
    "mooncake": {"master_service_entry": "127.0.0.1:50051"},
    "tair_mem_pool": {"domain": "pool.local:6379", "capacity": 1 << 30},
    "s3": {"bucket": "kv-bucket", "prefix": "/cache/", "region": "eu-west-1"},
}
CLASSES = {
    "nfs": FileBackend,
    "threefs": ThreeFSBackend,
    "vcnsthreefs": VcnsThreeFSBackend,
    "mooncake": MooncakeBackend,
    "tair_mem_pool": TairMemPoolBackend,
    "s3": S3Backend,
}


def config(field, name="st_01", **overrides):
    spec = dict(VALID[field], **overrides)
    return StorageConfig.model_validate({"global_unique_name": name, field: spec})


@pytest.fixture
def s3_clients():
    return []


@pytest.fixture
def registry(s3_clients):
    def s3_factory():
        s3_clients.append(object())
        return s3_clients[-1]

    # A client that is never used: building a pool backend must not connect.
    return StorageRegistry(lambda: redis.Redis(host="127.0.0.1", port=1), s3_factory)


@pytest.mark.parametrize("field", sorted(VALID))
def test_valid_configs_build_their_backend(registry, field):
    cfg = config(field)
    registry.validate(cfg)
    backend = registry.backend(cfg)
    assert type(backend) is CLASSES[field]
    assert backend.storage_type == cfg.storage_type
    assert backend.name == "st_01"


def test_vcns_fields_are_exposed(registry):
    backend = registry.backend(config("vcnsthreefs"))
    assert backend.storage_type is StorageType.ST_VCNS_3FS
    assert (backend.remote_host, backend.remote_port, backend.meta_storage_uri) == ("10.0.0.1", 8000, "meta://x")


@pytest.mark.parametrize(
    "field, overrides, named",
    [
        ("nfs", {"root_path": ""}, "nfs.root_path"),
        ("nfs", {"root_path": "relative/dir"}, "nfs.root_path"),
        ("nfs", {"root_path": "/mnt/../etc"}, "nfs.root_path"),
        ("nfs", {"key_count_per_file": -1}, "nfs.key_count_per_file"),
        ("nfs", {"key_count_per_file": 65537}, "nfs.key_count_per_file"),
        ("threefs", {"mountpoint": ""}, "threefs.mountpoint"),
        ("threefs", {"root_dir": "/"}, "threefs.root_dir"),
        ("threefs", {"root_dir": "../escape"}, "threefs.root_dir"),
        ("threefs", {"key_count_per_file": -3}, "threefs.key_count_per_file"),
        ("vcnsthreefs", {"remote_port": 70000}, "vcnsthreefs.remote_port"),
        ("vcnsthreefs", {"root_dir": "a/../.."}, "vcnsthreefs.root_dir"),
        ("mooncake", {"master_service_entry": ""}, "mooncake.master_service_entry"),
        ("mooncake", {"master_service_entry": "no-port"}, "mooncake.master_service_entry"),
        ("tair_mem_pool", {"capacity": 0}, "tair_mem_pool.capacity"),
        ("tair_mem_pool", {"capacity": -5}, "tair_mem_pool.capacity"),
        ("tair_mem_pool", {"capacity": (1 << 48) + 1}, "tair_mem_pool.capacity"),
        ("tair_mem_pool", {"domain": "pool.local"}, "tair_mem_pool.domain"),
        ("tair_mem_pool", {"timeout": -1}, "tair_mem_pool.timeout"),
        ("s3", {"bucket": ""}, "s3.bucket"),
        ("s3", {"bucket": "a/b"}, "s3.bucket"),
    ],
)
def test_invalid_spec_fields_are_named(registry, field, overrides, named):
    cfg = config(field, **overrides)
    with pytest.raises(InvalidArgumentError, match=named.replace(".", r"\.")):
        registry.validate(cfg)
    with pytest.raises(InvalidArgumentError):
        registry.backend(cfg)


@pytest.mark.parametrize("name", ["", "has space", "a/b", "x" * 129, "a:b", "a?b"])
def test_bad_names_are_rejected(registry, name):
    with pytest.raises(InvalidArgumentError, match="global_unique_name"):
        registry.validate(config("nfs", name=name))


def test_missing_spec_is_rejected(registry):
    with pytest.raises(InvalidArgumentError, match="storage spec is missing"):
        registry.validate(StorageConfig(global_unique_name="empty"))


def test_backend_is_cached_per_config_version(registry):
    first = registry.backend(config("nfs"))
    assert registry.backend(config("nfs")) is first
    updated = registry.backend(config("nfs", key_count_per_file=2))
    assert updated is not first and updated.pack_count == 2
    assert registry.backend(config("nfs", key_count_per_file=2)) is updated
    assert registry.backend(config("nfs", name="other")) is not updated


def test_s3_client_is_built_lazily_once(registry, s3_clients):
    backend = registry.backend(config("s3"))
    assert s3_clients == []
    assert backend.client is backend.client
    assert s3_clients == [backend.client]
    assert (backend.bucket, backend.prefix, backend.region) == ("kv-bucket", "cache", "eu-west-1")


#: What upstream's engine SDK reads from ``storage_configs`` per type (API.md); an unset
#: ``key_count_per_file`` shows as 1, the file size KVCM's URIs follow (upstream's default).
SDK_ENTRIES = {
    "nfs": ("file", {"root_path": "/mnt/nfs/", "key_count_per_file": 8}),
    "threefs": ("hf3fs", {"cluster_name": "", "mountpoint": "/3fs", "root_dir": "kv/", "key_count_per_file": 1}),
    "vcnsthreefs": (
        "vcns_hf3fs",
        {
            "cluster_name": "",
            "mountpoint": "/3fs",
            "root_dir": "kv",
            "key_count_per_file": 1,
            "remote_host": "10.0.0.1",
            "remote_port": 8000,
            "meta_storage_uri": "meta://x",
        },
    ),
    "mooncake": (
        "mooncake",
        {
            "local_hostname": "",
            "metadata_connstring": "",
            "protocol": "",
            "rdma_device": "",
            "master_server_entry": "127.0.0.1:50051",
        },
    ),
    "tair_mem_pool": (
        "pace",
        {"enable_vipserver": False, "domain": "pool.local:6379", "timeout": 0, "service_discovery_url": ""},
    ),
    "s3": ("s3", {"bucket": "kv-bucket", "prefix": "/cache/", "region": "eu-west-1"}),
}


@pytest.mark.parametrize("field", sorted(VALID))
def test_sdk_entry_uses_upstream_type_strings_and_field_names(field):
    sdk_type, storage_spec = SDK_ENTRIES[field]
    assert CLASSES[field].sdk_type == sdk_type
    assert sdk_entry(config(field), True) == {
        "type": sdk_type,
        "is_available": True,
        "global_unique_name": "st_01",
        "storage_spec": storage_spec,
    }


def test_a_vipserver_discovery_url_enables_vipserver_for_older_sdks():
    entry = sdk_entry(config("tair_mem_pool", service_discovery_url="vipserver://pace.meta"), False)
    assert entry["storage_spec"]["enable_vipserver"] is True and entry["is_available"] is False
