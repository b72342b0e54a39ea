"""Helpers shared by the test tiers (fixtures live in the conftest files, not here)."""
from __future__ import annotations

import functools
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TRACES = (REPO_ROOT.parent / "shared" / "traces").resolve()
CONVERSATION = TRACES / "mooncake_conversation.jsonl"
EVENT_LOG = TRACES / "kvcm_event_publisher.log"


def free_port() -> int:
    """A loopback port nothing listens on (yet)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    runtime = Runtime(settings=Settings(valkey_url=valkey_url, **settings), clock=clock, valkey=valkey)
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
