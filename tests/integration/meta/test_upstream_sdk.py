"""KVCM's answers read the way upstream's engine-side transfer SDK reads them (API.md,
"What engine SDKs parse"), for every storage type.

The SDK builds one backend per entry of ``registerInstance.storage_configs`` (chosen by
its upstream ``type`` string, configured from ``storage_spec``), then, for every URI,
picks the backend by the URI's host and moves ``size`` bytes at offset ``blkid × size``
of the file named by the URI's path. Here an "engine" does exactly that: it writes every
block through startWriteCache's URIs and reads it back through getCacheLocation's — on
real files for the file backends, through moto for S3 — and the bytes must match.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import boto3
import pytest

from .harness import code

SPECS = [{"name": "tp0", "size": 64}, {"name": "tp1", "size": 32}]
KEYS = [11, 12, 13, 14, 15]

#: storage_spec fields upstream's SDK reads, per upstream type string (API.md).
UPSTREAM_SPEC_FIELDS = {
    "file": {"root_path", "key_count_per_file"},
    "hf3fs": {"cluster_name", "mountpoint", "root_dir", "key_count_per_file"},
    "vcns_hf3fs": {
        "cluster_name",
        "mountpoint",
        "root_dir",
        "key_count_per_file",
        "remote_host",
        "remote_port",
        "meta_storage_uri",
    },
    "mooncake": {"local_hostname", "metadata_connstring", "protocol", "rdma_device", "master_server_entry"},
    "pace": {"enable_vipserver", "domain", "timeout"},
    "s3": {"bucket", "prefix", "region"},
}


@dataclass(frozen=True)
class Uri:
    scheme: str
    host: str
    path: str
    params: dict[str, str]


def parse_uri(uri: str) -> Uri:
    """``<type>://<name><absolute path>?<params sorted by name>``, split as the SDK does
    (no percent-decoding: KVCM's paths are unreserved characters only)."""
    scheme, sep, rest = uri.partition("://")
    assert sep and scheme, uri
    location, _, query = rest.partition("?")
    host, slash, path = location.partition("/")
    assert slash, f"no absolute path in {uri}"
    pairs = [tuple(item.split("=", 1)) for item in query.split("&")] if query else []
    names = [name for name, _ in pairs]
    assert names == sorted(names) and len(set(names)) == len(names), f"parameters not sorted by name: {uri}"
    assert "%" not in path, uri
    return Uri(scheme, host, "/" + path, dict(pairs))


class Engine:
    """What a connector does with KVCM's answers, one storage backend per config entry."""

    def __init__(self, storage_configs: str) -> None:
        entries = json.loads(storage_configs)
        assert all(list(e) == ["type", "is_available", "global_unique_name", "storage_spec"] for e in entries), entries
        self.configs = {e["global_unique_name"]: e for e in entries}
        self.objects: dict[str, bytes] = {}  # mooncake's store, keyed by ?key=
        self.pool = bytearray(1 << 16)  # the TairMemPool's memory, addressed by the URI's path

    def _target(self, uri: str) -> tuple[dict, Uri, int]:
        """The storage config the URI's host names, the URI, and the byte size it covers."""
        parsed = parse_uri(uri)
        config = self.configs[parsed.host]
        assert config["type"] == parsed.scheme, (config["type"], uri)
        return config, parsed, int(parsed.params["size"])

    def _file(self, uri: str) -> tuple[str, int, int]:
        """Path on the engine's mount, byte offset and size of a file-backend URI."""
        config, parsed, size = self._target(uri)
        spec = config["storage_spec"]
        root = spec["root_path"] if config["type"] == "file" else os.path.join(spec["mountpoint"], spec["root_dir"])
        assert parsed.path.startswith(root.rstrip("/") + "/"), (root, uri)
        if spec["key_count_per_file"] > 1:
            assert "blkid" in parsed.params, uri
        return parsed.path, int(parsed.params.get("blkid", 0)) * size, size

    @staticmethod
    def _pace_offset(parsed: Uri) -> int:
        """The SDK reads a memory pool address from the path: ``pace://<name>/<offset>``."""
        assert parsed.path[1:].isdigit(), parsed
        return int(parsed.path[1:])

    def write(self, uri: str, data: bytes) -> None:
        config, parsed, size = self._target(uri)
        assert len(data) == size
        kind = config["type"]
        if kind in ("file", "hf3fs", "vcns_hf3fs"):
            path, offset, _ = self._file(uri)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "r+b" if os.path.exists(path) else "wb") as handle:
                handle.seek(offset)
                handle.write(data)
        elif kind == "mooncake":
            self.objects[parsed.params["key"]] = data
        elif kind == "pace":
            offset = self._pace_offset(parsed)
            self.pool[offset : offset + size] = data
        else:
            assert kind == "s3"
            boto3.client("s3").put_object(Bucket=config["storage_spec"]["bucket"], Key=parsed.path[1:], Body=data)

    def read(self, uri: str) -> bytes:
        config, parsed, size = self._target(uri)
        kind = config["type"]
        if kind in ("file", "hf3fs", "vcns_hf3fs"):
            path, offset, _ = self._file(uri)
            with open(path, "rb") as handle:
                handle.seek(offset)
                return handle.read(size)
        if kind == "mooncake":
            return self.objects[parsed.params["key"]]
        if kind == "pace":
            offset = self._pace_offset(parsed)
            return bytes(self.pool[offset : offset + size])
        return (
            boto3.client("s3").get_object(Bucket=config["storage_spec"]["bucket"], Key=parsed.path[1:])["Body"].read()
        )


def storage_of(kind: str, tmp_path) -> tuple[dict, str]:
    """A storage config of ``kind`` (wire JSON) and the upstream type it must show as."""
    if kind.startswith("nfs"):
        root = tmp_path / "nfs"
        root.mkdir()
        return {"nfs": {"root_path": f"{root}/", "key_count_per_file": 4 if kind == "nfs-packed" else 1}}, "file"
    if kind in ("3fs", "vcns-3fs"):
        mount = tmp_path / "3fs"
        (mount / "stage" / "kv").mkdir(parents=True)
        spec = {
            "cluster_name": "c1",
            "mountpoint": str(mount),
            "root_dir": "stage/kv/",
            "key_count_per_file": 2,
            "touch_file_when_create": True,
        }
        if kind == "3fs":
            return {"threefs": spec}, "hf3fs"
        return {
            "vcnsthreefs": {**spec, "remote_host": "10.1.1.1", "remote_port": 9000, "meta_storage_uri": "meta://m"}
        }, "vcns_hf3fs"
    if kind == "mooncake":
        return {
            "mooncake": {
                "local_hostname": "engine-1",
                "metadata_connstring": "etcd://127.0.0.1:2379",
                "protocol": "rdma",
                "rdma_device": "mlx5_0",
                "master_service_entry": "127.0.0.1:50051",
            }
        }, "mooncake"
    if kind == "pace":
        return {"tair_mem_pool": {"domain": "127.0.0.1:7000", "timeout": 500, "capacity": 1 << 16}}, "pace"
    boto3.client("s3").create_bucket(Bucket="kvcm-data")
    return {"s3": {"bucket": "kvcm-data", "prefix": "kv", "region": "us-east-1"}}, "s3"


KINDS = ["nfs-packed", "nfs-single", "3fs", "vcns-3fs", "mooncake", "pace", "s3"]


@pytest.mark.parametrize("kind", KINDS)
def test_an_engine_writes_and_reads_blocks_through_kvcm_answers(http, tmp_path, kind):
    spec, upstream_type = storage_of(kind, tmp_path)
    assert code(http("addStorage", {"storage": {"global_unique_name": "store_01", **spec}})) == "OK"
    assert (
        code(
            http(
                "createInstanceGroup",
                {"instance_group": {"name": "g1", "storage_candidates": ["store_01"], "quota": {"capacity": 1 << 30}}},
            )
        )
        == "OK"
    )
    registered = http(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": "inst1",
            "block_size": 4,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert code(registered) == "OK", registered
    engine = Engine(registered["storage_configs"])
    config = engine.configs["store_01"]
    assert (config["type"], config["is_available"]) == (upstream_type, True)
    assert UPSTREAM_SPEC_FIELDS[upstream_type] <= set(config["storage_spec"])

    start = http("startWriteCache", {"instance_id": "inst1", "block_keys": KEYS})
    assert code(start) == "OK" and len(start["locations"]) == len(KEYS), start
    written = {}
    for key, location in zip(KEYS, start["locations"], strict=True):
        for spec_info, spec_location in zip(SPECS, location["location_specs"], strict=True):
            data = os.urandom(spec_info["size"])
            engine.write(spec_location["uri"], data)
            written[key, spec_location["name"]] = data
    finish = http(
        "finishWriteCache",
        {
            "instance_id": "inst1",
            "write_session_id": start["write_session_id"],
            "success_blocks": {"offset": len(KEYS)},
        },
    )
    assert code(finish) == "OK", finish

    read = http("getCacheLocation", {"instance_id": "inst1", "query_type": "QT_PREFIX_MATCH", "block_keys": KEYS})
    assert len(read["locations"]) == len(KEYS), read
    for key, location in zip(KEYS, read["locations"], strict=True):
        for spec_location in location["location_specs"]:
            assert engine.read(spec_location["uri"]) == written[key, spec_location["name"]], (key, spec_location)


def uris_of(http, keys):
    start = http("startWriteCache", {"instance_id": "inst1", "block_keys": keys})
    assert code(start) == "OK", start
    return [parse_uri(spec["uri"]) for location in start["locations"] for spec in location["location_specs"]]


@pytest.mark.parametrize("kind", ["nfs-packed", "nfs-single", "3fs", "vcns-3fs"])
def test_file_uris_carry_the_absolute_path_on_the_mount_and_the_block_index(http, tmp_path, kind):
    spec, upstream_type = storage_of(kind, tmp_path)
    http("addStorage", {"storage": {"global_unique_name": "store_01", **spec}})
    http("createInstanceGroup", {"instance_group": {"name": "g1", "storage_candidates": ["store_01"]}})
    registered = http(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": "inst1",
            "block_size": 4,
            "location_spec_infos": SPECS[:1],
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    storage_spec = json.loads(registered["storage_configs"])[0]["storage_spec"]
    uris = uris_of(http, [1, 2, 3])
    root = str(tmp_path / ("nfs" if kind.startswith("nfs") else "3fs/stage/kv"))
    assert all(
        u.scheme == upstream_type and u.host == "store_01" and u.path.startswith(root + "/inst1/tp0/") for u in uris
    ), uris
    assert all(u.params["size"] == "64" for u in uris)
    if storage_spec["key_count_per_file"] > 1:
        pack = storage_spec["key_count_per_file"]
        assert [int(u.params["blkid"]) for u in uris] == [i % pack for i in range(3)]
        assert len({u.path for u in uris}) == -(-3 // pack)
    else:
        assert all("blkid" not in u.params for u in uris) and len({u.path for u in uris}) == 3
