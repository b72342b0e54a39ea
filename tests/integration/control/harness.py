"""Helpers of the control-plane and admin tests: wire calls, configs, snapshots (the
``runtime``, ``control`` and ``client`` fixtures are in tests/integration/conftest.py)."""

from __future__ import annotations

from typing import Any

from chalicelib.protocol.models import (
    InstanceGroup,
    LocationSpecInfo,
    ModelDeployment,
    RegisterInstanceRequest,
    StorageConfig,
)
from tests.helpers import post_api

TABLE = "kvcm-control-test"


#: The wire call of these tests (HTTP status, decoded answer), under the name they import.
post = post_api


def call(client, method: str, body: Any = None, **kwargs) -> dict:
    """POST and assert HTTP 200; returns the body."""
    status, data = post(client, method, body, **kwargs)
    assert status == 200, data
    return data


def code(data: dict) -> str:
    return data["header"]["status"]["code"]


def message(data: dict) -> str:
    return data["header"]["status"]["message"]


def nfs(name: str, root: str = "/mnt/kvcm") -> dict:
    """A storage config in wire JSON."""
    return {"global_unique_name": name, "nfs": {"root_path": root, "key_count_per_file": 4}}


def group_json(name: str, *candidates: str, **extra: Any) -> dict:
    return {"name": name, "storage_candidates": list(candidates or ("nfs1",)), **extra}


def add_storages(control, *names: str) -> None:
    """Add an NFS storage per name (default: ``group_json``'s default candidate): a group may
    name only storages that exist."""
    for name in names or ("nfs1",):
        control.add_storage(StorageConfig.model_validate(nfs(name)))


def group(name: str, *candidates: str, **extra: Any) -> InstanceGroup:
    return InstanceGroup.model_validate(group_json(name, *candidates, **extra))


def register_request(
    instance_id: str, group_name: str = "g1", block_size: int = 16, user_data: str = "", **overrides: Any
) -> RegisterInstanceRequest:
    fields = dict(
        instance_group=group_name,
        instance_id=instance_id,
        block_size=block_size,
        location_spec_infos=[LocationSpecInfo(name="tp0", size=1024), LocationSpecInfo(name="tp1", size=1024)],
        model_deployment=ModelDeployment(model_name="qwen", dtype="bf16", tp_size=2, user_data=user_data),
    )
    fields.update(overrides)
    return RegisterInstanceRequest(**fields)


def table_items(runtime, pk: str) -> list[dict]:
    """Every raw item of one partition (to check nothing was half-written)."""
    return runtime.control.table.query(pk)


def snapshot(runtime) -> tuple[list, dict]:
    """Everything the control plane and the lease keep: all table items and Valkey keys
    (but the metrics, which count refused calls too)."""
    items = runtime.aws("dynamodb").scan(TableName=TABLE, ConsistentRead=True)["Items"]
    valkey = runtime.valkey
    keys = {
        key: (valkey.type(key), valkey.dump(key))
        for key in sorted(valkey.keys("*"))
        if key.decode() != runtime.metrics_store.key
    }
    return sorted(items, key=lambda i: (i["pk"]["S"], i["sk"]["S"])), keys


def enable_auth(runtime) -> None:
    runtime.reconfigure(auth_enabled=True)
