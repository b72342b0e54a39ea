"""Fixtures and helpers for control-plane and admin tests (real moto DynamoDB + real Valkey).

Test modules import the fixtures they use from here (pytest picks up imported fixtures).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import threading
from typing import Any, Optional

import pytest

from chalicelib.control import ensure_table
from chalicelib.protocol.models import InstanceGroup, LocationSpecInfo, ModelDeployment, RegisterInstanceRequest
from chalicelib.runtime import Runtime, set_runtime
from chalicelib.settings import Settings

TABLE = "kvcm-control-test"


def serialize_transactions(monkeypatch) -> None:
    """Serialize moto's TransactWriteItems, as DynamoDB does.

    moto applies a transaction with no isolation: it snapshots the tables, applies the
    items one by one and, on a failed condition, restores the snapshot — clobbering any
    transaction that committed meanwhile. DynamoDB serializes conflicting transactions;
    this lock restores that guarantee so concurrency tests exercise our conditions, not
    moto's races.
    """
    from moto.dynamodb.models import DynamoDBBackend

    original = DynamoDBBackend.transact_write_items
    lock = threading.Lock()

    @functools.wraps(original)
    def serialized(self, *args, **kwargs):
        with lock:
            return original(self, *args, **kwargs)

    monkeypatch.setattr(DynamoDBBackend, "transact_write_items", serialized)


def build_runtime(valkey_url: str, clock, valkey, **settings: Any) -> Runtime:
    """A Runtime on the test Valkey and moto (the control table created)."""
    settings.setdefault("node_id", "node-a")
    rt = Runtime(settings=Settings(control_table=TABLE, valkey_url=valkey_url, key_prefix="kvcmtest", **settings),
                 clock=clock, valkey=valkey)
    ensure_table(rt.aws("dynamodb"), TABLE)
    return rt


@pytest.fixture
def runtime(aws, valkey, valkey_url, clock, monkeypatch):
    """A Runtime on moto + Valkey, installed for the app (``set_runtime``)."""
    serialize_transactions(monkeypatch)
    rt = build_runtime(valkey_url, clock, valkey)
    set_runtime(rt)
    yield rt
    set_runtime(None)


@pytest.fixture
def control(runtime):
    return runtime.control


@pytest.fixture
def client(runtime):
    """chalice.test.Client over the real app."""
    from chalice.test import Client

    from app import app

    with Client(app) as test_client:
        yield test_client


def post(client, method: str, body: Any = None, raw: Optional[str] = None,
         headers: Optional[dict] = None) -> tuple[int, dict]:
    """POST /api/<method>; returns (HTTP status, decoded JSON body)."""
    payload = raw if raw is not None else json.dumps({} if body is None else body)
    response = client.http.post(f"/api/{method}", body=payload,
                                headers={"Content-Type": "application/json", **(headers or {})})
    return response.status_code, json.loads(response.body)


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


def group(name: str, *candidates: str, **extra: Any) -> InstanceGroup:
    return InstanceGroup.model_validate(group_json(name, *candidates, **extra))


def register_request(instance_id: str, group_name: str = "g1", block_size: int = 16,
                     user_data: str = "", **overrides: Any) -> RegisterInstanceRequest:
    fields = dict(instance_group=group_name, instance_id=instance_id, block_size=block_size,
                  location_spec_infos=[LocationSpecInfo(name="tp0", size=1024),
                                       LocationSpecInfo(name="tp1", size=1024)],
                  model_deployment=ModelDeployment(model_name="qwen", dtype="bf16", tp_size=2, user_data=user_data))
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
    keys = {key: (valkey.type(key), valkey.dump(key)) for key in sorted(valkey.keys("*"))
            if key.decode() != runtime.metrics_store.key}
    return sorted(items, key=lambda i: (i["pk"]["S"], i["sk"]["S"])), keys


def enable_auth(runtime) -> None:
    runtime.settings = dataclasses.replace(runtime.settings, auth_enabled=True)
