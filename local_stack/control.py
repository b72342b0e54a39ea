"""The control table of the local stack, kept between runs and across crashes.

moto forgets everything when it stops, so the table lives on disk as a snapshot
(``control.json``: DynamoDB's typed item format, binary values as base64) plus a journal
(``control.journal``) of every write since. Every write request moto receives for the
table (from the app, a task or a state machine) appends the written items' new state to
the journal and fsyncs it *before moto answers*: a change that was acknowledged survives
a SIGKILL of the stack. The journal is folded into the snapshot at start, at stop, and
when it grows past ``COMPACT_BYTES``.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .guard import StackStartError

BATCH_SIZE = 25  # DynamoDB's BatchWriteItem limit (moto does not enforce it)
COMPACT_BYTES = 1 << 20
#: moto's DynamoDB request handlers that write items (PartiQL statements are not used here).
WRITE_ACTIONS = ("put_item", "update_item", "delete_item", "batch_write_item", "transact_write_items")


def _encode(value: Any) -> Any:
    """DynamoDB JSON → plain JSON (bytes in ``B`` / ``BS`` become base64 text)."""
    if isinstance(value, dict):
        return {
            key: (
                base64.b64encode(item).decode("ascii")
                if key == "B"
                else [base64.b64encode(b).decode("ascii") for b in item]
                if key == "BS"
                else _encode(item)
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_encode(item) for item in value]
    return value


def _decode(value: Any) -> Any:
    """The inverse of ``_encode``."""
    if isinstance(value, dict):
        return {
            key: (
                base64.b64decode(item)
                if key == "B"
                else [base64.b64decode(b) for b in item]
                if key == "BS"
                else _decode(item)
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


class JournalDamagedError(StackStartError):
    """A journal line other than the last cannot be read: replaying around it could bring
    back a deleted entity, so the start stops."""


def _b64(value: Any) -> str:
    return base64.b64encode(value).decode("ascii") if isinstance(value, bytes) else value


def _wire(value: Any) -> dict[str, Any]:
    """A moto ``DynamoType`` in the form ``_encode`` gives a scanned value (moto keeps a
    binary value as bytes or as its base64 text, depending on how it arrived)."""
    if value.type == "B":
        return {"B": _b64(value.value)}
    if value.type == "BS":
        return {"BS": [_b64(item) for item in value.value]}
    if value.type == "M":
        return {"M": {name: _wire(item) for name, item in value.value.items()}}
    if value.type == "L":
        return {"L": [_wire(item) for item in value.value]}
    return {value.type: value.value}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _written_keys(action: str, body: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    """``(table, item or key)`` of every item a write request changes."""
    if action == "put_item":
        yield body["TableName"], body["Item"]
    elif action in ("update_item", "delete_item"):
        yield body["TableName"], body["Key"]
    elif action == "batch_write_item":
        for table, requests in body["RequestItems"].items():
            for request in requests:
                yield (
                    table,
                    (request["PutRequest"]["Item"] if "PutRequest" in request else request["DeleteRequest"]["Key"]),
                )
    else:  # transact_write_items
        for operation in body["TransactItems"]:
            kind, spec = next(iter(operation.items()))
            if kind != "ConditionCheck":
                yield spec["TableName"], spec.get("Item") or spec["Key"]


class ControlSnapshot:
    """The table ``table_name`` saved to ``path`` (snapshot) and ``path.journal`` (writes since)."""

    #: The one instance whose journal moto's handlers write to (they are patched process-wide).
    _attached: ControlSnapshot | None = None

    def __init__(self, dynamodb: Any, table_name: str, path: Path, key_names: tuple[str, ...] = ("pk", "sk")) -> None:
        self.dynamodb = dynamodb
        self.table_name = table_name
        self.path = path
        self.journal_path = path.with_suffix(".journal")
        self.key_names = key_names
        # Held across a write request and its journal append, and across a compaction:
        # the journal's order is the order moto applied the writes in.
        self._lock = threading.Lock()
        self._journal_fd: int | None = None
        self._originals: dict[str, Callable[..., Any]] = {}

    # ------------------------------------------------------------ snapshot

    def save(self) -> int:
        """Fold everything into the snapshot (written atomically, fsync'd), then empty the
        journal; returns the item count."""
        with self._lock:
            items = [
                item
                for page in self.dynamodb.get_paginator("scan").paginate(TableName=self.table_name, ConsistentRead=True)
                for item in page["Items"]
            ]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(".json.partial")
            # Accounts' password hashes and API key digests: readable by the owner only.
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            os.fchmod(fd, 0o600)  # a partial left by a crash keeps its old mode otherwise
            with open(fd, "w", encoding="utf-8") as file:
                json.dump({"table": self.table_name, "items": _encode(items)}, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, self.path)
            _fsync_dir(self.path.parent)
            if self._journal_fd is not None:
                os.ftruncate(self._journal_fd, 0)
                os.fsync(self._journal_fd)
            elif self.journal_path.exists():
                os.truncate(self.journal_path, 0)
        return len(items)

    def compact_if_grown(self, limit_bytes: int = COMPACT_BYTES) -> None:
        """``save`` once the journal is larger than ``limit_bytes``."""
        if self.journal_path.exists() and self.journal_path.stat().st_size > limit_bytes:
            self.save()

    def _key(self, item: dict[str, Any]) -> str:
        return json.dumps([item[name] for name in self.key_names if name in item], sort_keys=True)

    def _saved_items(self) -> list[dict[str, Any]]:
        """The snapshot's items with the journal replayed over them (encoded form). A last
        line cut short by a crash was never acknowledged and is ignored."""
        items: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            for item in json.loads(self.path.read_text(encoding="utf-8"))["items"]:
                items[self._key(item)] = item
        if self.journal_path.exists():
            lines = self.journal_path.read_bytes().split(b"\n")
            for number, line in enumerate(lines, 1):
                try:
                    entry = json.loads(line) if line else None
                except ValueError:
                    if number == len(lines):
                        break
                    raise JournalDamagedError(
                        f"the control-table journal {self.journal_path} is damaged at line {number}: repair "
                        f"or move it away (its changes since the last snapshot are then lost)"
                    ) from None
                if entry is None:
                    continue
                if entry["item"] is None:
                    items.pop(self._key(entry["key"]), None)
                else:
                    items[self._key(entry["key"])] = entry["item"]
        return list(items.values())

    def restore(self) -> int:
        """Put every saved item (snapshot + journal) back; returns the item count."""
        items = _decode(self._saved_items())
        for start in range(0, len(items), BATCH_SIZE):
            requests = [{"PutRequest": {"Item": item}} for item in items[start : start + BATCH_SIZE]]
            while requests:
                response = self.dynamodb.batch_write_item(RequestItems={self.table_name: requests})
                requests = response.get("UnprocessedItems", {}).get(self.table_name, [])
        return len(items)

    # ------------------------------------------------------------ journal

    def attach(self) -> None:
        """Journal every write moto receives for the table from now on, durably, before
        moto answers it."""
        from moto.dynamodb.responses import DynamoHandler

        if ControlSnapshot._attached is not None:
            raise RuntimeError("a control-table journal is already attached in this process")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(self._journal_fd, 0o600)  # a journal made by an older version was 0644
        ControlSnapshot._attached = self
        for action in WRITE_ACTIONS:
            self._originals[action] = original = getattr(DynamoHandler, action)
            setattr(DynamoHandler, action, self._journaled(action, original))

    def detach(self) -> None:
        """Undo ``attach`` (idempotent)."""
        from moto.dynamodb.responses import DynamoHandler

        for action, original in self._originals.items():
            setattr(DynamoHandler, action, original)
        self._originals.clear()
        if ControlSnapshot._attached is self:
            ControlSnapshot._attached = None
        fd, self._journal_fd = self._journal_fd, None
        if fd is not None:
            os.close(fd)

    def _journaled(self, action: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def write_then_journal(handler: Any) -> Any:
            keys = {
                self._key(item): {name: item[name] for name in self.key_names if name in item}
                for table, item in _written_keys(action, handler.body)
                if table == self.table_name
            }
            if not keys:
                return original(handler)
            with self._lock:
                answer = original(handler)  # raises (nothing written) on a failed condition
                self._append(handler.dynamodb_backend.get_table(self.table_name), list(keys.values()))
            return answer

        return write_then_journal

    def _append(self, table: Any, keys: list[dict[str, Any]]) -> None:
        """Journal the current state of ``keys`` in moto's ``table`` (read back: an
        update's result is only known to moto) in one fsync'd write."""
        from moto.dynamodb.models.dynamo_type import DynamoType

        lines = []
        for key in keys:
            item = table.get_item(*(DynamoType(key[name]) for name in self.key_names if name in key))
            lines.append(
                json.dumps({"key": key, "item": item and {name: _wire(value) for name, value in item.attrs.items()}})
            )
        fd = self._journal_fd
        assert fd is not None, "the journal is opened before the first write"
        os.write(fd, ("\n".join(lines) + "\n").encode())
        os.fsync(fd)
