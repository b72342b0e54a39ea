"""The audit log: admin mutations and denied calls, in the control table (docs/security.md).

Items live in partitions of their own, one per UTC day (``pk = AUDIT#<yyyy-mm-dd>``,
``sk = <time µs, 20 digits>#<random>``), with an ``expires_at`` (epoch seconds) for the
table's TTL (``table.TTL_ATTRIBUTE``). They are written with a plain PutItem, outside the epoch-bumping
transactions: an audit record is not configuration, and a flood of denied calls must not
make every container reload its config.

A record holds who (account and key id, or what the caller claimed), what (method,
target, outcome code and message), when and from where (source IP) — never a secret:
the dispatcher passes names, not request bodies. Denied calls are recorded at most
``max_denied`` per container in each ``denied_window_s``; the next record written counts
those left out (``suppressed``), so a flood of bad credentials cannot flood the table
(nor, locally, the fsync'd journal and ``control.json``): 10 a minute, not 20 a second.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..clock import Clock
from ..protocol.models import AuditRecord
from .table import TTL_ATTRIBUTE, ControlTable, aws_errors, decode, encode

AUDIT_PK = "AUDIT#"
MAX_MESSAGE_LENGTH = 512
MAX_DAYS_QUERIED = 31


def _day(time_s: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time_s))


@dataclass(frozen=True)
class AuditEntry:
    """One audited call."""

    principal: str
    source: str
    api_name: str
    target: str
    code: str
    message: str
    denied: bool


class AuditLog:
    """Writes and reads audit records. Thread-safe; one per container."""

    def __init__(
        self, table: ControlTable, clock: Clock, ttl_days: int = 90, max_denied: int = 10, denied_window_s: int = 60
    ) -> None:
        self._table = table
        self._clock = clock
        self._ttl_s = ttl_days * 86400
        self._max_denied = max_denied
        self._denied_window_s = denied_window_s
        self._lock = threading.Lock()
        self._window = -1
        self._denied_in_window = 0
        self._suppressed = 0

    def record(self, entry: AuditEntry) -> None:
        """Store one entry (or, for a denied call over the rate, count it as suppressed)."""
        now = self._clock.now()
        with self._lock:
            window = int(now // self._denied_window_s)
            if window != self._window:
                self._window, self._denied_in_window = window, 0
            if entry.denied:
                if self._denied_in_window >= self._max_denied:
                    self._suppressed += 1
                    return
                self._denied_in_window += 1
            suppressed, self._suppressed = self._suppressed, 0
        now_us = int(now * 1e6)
        item = {
            "pk": AUDIT_PK + _day(now),
            "sk": f"{now_us:020d}#{os.urandom(4).hex()}",
            "at_us": now_us,
            "principal": entry.principal,
            "source": entry.source,
            "api": entry.api_name,
            "target": entry.target,
            "code": entry.code,
            "message": entry.message[:MAX_MESSAGE_LENGTH],
            TTL_ATTRIBUTE: int(now) + self._ttl_s,
        }
        if suppressed:
            item["suppressed"] = suppressed
        with aws_errors("audit write"):
            self._table.client.put_item(TableName=self._table.name, Item=encode(item))

    def query(self, start_s: float, end_s: float, limit: int) -> list[AuditRecord]:
        """Records with ``start_s <= time < end_s``, newest first, at most ``limit``
        (the window is cut to its last ``MAX_DAYS_QUERIED`` days)."""
        start_s = max(start_s, end_s - MAX_DAYS_QUERIED * 86400)
        records: list[AuditRecord] = []
        day_s = end_s
        while len(records) < limit and _day(day_s) >= _day(start_s):
            for item in self._day_items(_day(day_s), int(start_s * 1e6), int(end_s * 1e6), limit - len(records)):
                records.append(
                    AuditRecord(
                        time=int(item["at_us"]),
                        principal=item["principal"],
                        source=item["source"],
                        api_name=item["api"],
                        target=item["target"],
                        code=item["code"],
                        message=_with_suppressed(item),
                    )
                )
            day_s -= 86400
        return records

    def _day_items(self, day: str, start_us: int, end_us: int, limit: int) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "TableName": self._table.name,
            "ScanIndexForward": False,
            "ConsistentRead": True,
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :lo AND :hi",
            "ExpressionAttributeValues": encode(
                {":pk": AUDIT_PK + day, ":lo": f"{start_us:020d}", ":hi": f"{end_us - 1:020d}~"}
            ),
            "Limit": limit,
        }
        with aws_errors("audit query"):
            return [decode(i) for i in self._table.client.query(**kwargs).get("Items", [])]


def _with_suppressed(item: dict[str, Any]) -> str:
    suppressed: int | None = int(item["suppressed"]) if "suppressed" in item else None
    return str(item["message"]) + (f" ({suppressed} denied call(s) before this one not recorded)" if suppressed else "")
