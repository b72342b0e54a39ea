"""The control table of the local stack, kept between runs.

moto forgets everything when it stops, so the table is saved to a JSON file (DynamoDB's
typed item format; binary values as base64) and put back at the next start.
"""
from __future__ import annotations

import base64
import json
import os
import threading
from pathlib import Path
from typing import Any

BATCH_SIZE = 25  # DynamoDB's BatchWriteItem limit (moto does not enforce it)


def _encode(value: Any) -> Any:
    """DynamoDB JSON → plain JSON (bytes in ``B`` / ``BS`` become base64 text)."""
    if isinstance(value, dict):
        return {key: (base64.b64encode(item).decode("ascii") if key == "B"
                      else [base64.b64encode(b).decode("ascii") for b in item] if key == "BS"
                      else _encode(item)) for key, item in value.items()}
    if isinstance(value, list):
        return [_encode(item) for item in value]
    return value


def _decode(value: Any) -> Any:
    """The inverse of ``_encode``."""
    if isinstance(value, dict):
        return {key: (base64.b64decode(item) if key == "B"
                      else [base64.b64decode(b) for b in item] if key == "BS"
                      else _decode(item)) for key, item in value.items()}
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


class ControlSnapshot:
    """Saves a table to ``path`` and restores it from there."""

    def __init__(self, dynamodb: Any, table_name: str, path: Path) -> None:
        self.dynamodb = dynamodb
        self.table_name = table_name
        self.path = path
        self._lock = threading.Lock()

    def save(self) -> int:
        """Write every item to the file atomically; returns the item count."""
        items: list[dict] = []
        for page in self.dynamodb.get_paginator("scan").paginate(TableName=self.table_name,
                                                                 ConsistentRead=True):
            items.extend(page["Items"])
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(".json.partial")
            partial.write_text(json.dumps({"table": self.table_name, "items": _encode(items)}),
                               encoding="utf-8")
            os.replace(partial, self.path)
        return len(items)

    def restore(self) -> int:
        """Put every saved item back; returns the item count (0 without a file)."""
        if not self.path.exists():
            return 0
        items = _decode(json.loads(self.path.read_text(encoding="utf-8"))["items"])
        for start in range(0, len(items), BATCH_SIZE):
            requests = [{"PutRequest": {"Item": item}} for item in items[start:start + BATCH_SIZE]]
            while requests:
                response = self.dynamodb.batch_write_item(RequestItems={self.table_name: requests})
                requests = response.get("UnprocessedItems", {}).get(self.table_name, [])
        return len(items)
