"""The index side of the Copy quarantine (docs/tiered-storage.md "Copy quarantine").

A Copy whose bytes may still be written (its copy timed out: the writer may be alive) is
held: ``hold`` runs lua/copy_quarantine.lua on the session (every shard's part), which keeps
the session open with its WRITING targets, sets its guard state QUARANTINED with the
evidence, and moves its deadline to the release time. Only a release closes it
(``BlockIndex.finish`` with ``release_guard``: finish.lua's CAS on the guard state).

Every quarantined operation is also listed in two hashes on a slot of their own (``{<prefix>:cq}``:
one of every operation, one per group), written in one transaction after the session's
step, as a group's counters follow an instance's: what listAsyncCopyQuarantine and the
group's quarantine limits read, without scanning instances. The session is the truth: an
entry whose session is no longer quarantined (a release that died before forgetting it)
is skipped and dropped by the next ``prune``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from ..valkey import valkey_errors
from .block_index import BlockIndex
from .layout import CopyGuard, HoldResult
from .scripts import load_script
from .types import InstanceLayout, session_entries

#: The session fields a quarantine keeps (lua/copy_quarantine.lua).
_FIELDS = ("k", "m", "q", "qc", "qu", "qe", "qt", "qs", "qn", "d")


@dataclass(frozen=True)
class QuarantinedOperation:
    """An index entry: a quarantined Copy (its session id), its instance and what it holds."""

    operation_id: str
    group: str
    instance_id: str
    total_bytes: int
    blocks: int

    def encode(self) -> str:
        return json.dumps({"g": self.group, "i": self.instance_id, "b": self.total_bytes, "n": self.blocks})

    @classmethod
    def decode(cls, operation_id: str, raw: bytes) -> QuarantinedOperation:
        value = json.loads(raw)
        return cls(operation_id, value["g"], value["i"], int(value["b"]), int(value["n"]))


@dataclass(frozen=True)
class QuarantinePart:
    """What one shard's part of a Copy session keeps (guard None: not quarantined)."""

    #: (block key, target location id) and (block key, source location id), in order.
    targets: list[tuple[int, int]]
    sources: list[tuple[int, int]]
    guard: CopyGuard | None
    create_time_us: int
    update_time_us: int
    last_error: str
    backend_task_ids: list[str]
    source_storage_name: str
    target_storage_name: str
    release_ms: int


@dataclass(frozen=True)
class Evidence:
    """What a quarantine keeps of the execution whose copy timed out."""

    last_error: str
    backend_task_ids: Sequence[str]
    source_storage_name: str
    target_storage_name: str


class CopyQuarantineIndex:
    """Holds Copy sessions in quarantine and keeps the index of quarantined operations."""

    def __init__(self, index: BlockIndex) -> None:
        self.index = index
        self.client = index.client
        self._hold = index.client.register_script(load_script("copy_quarantine"))

    @property
    def _operations_key(self) -> str:
        return f"{{{self.index.prefix}:cq}}:ops"

    def _group_key(self, group: str) -> str:
        return f"{{{self.index.prefix}:cq}}:g:{group}"

    def hold(
        self, layout: InstanceLayout, operation_id: str, release_ms: int, now_us: int, evidence: Evidence
    ) -> tuple[bool, list[tuple[int, int]]] | None:
        """Quarantine the session ``operation_id`` in every shard holding a part of it (one
        step each). Returns (whether this call held it: False when held already, a step run
        again; the parts' targets), or None when no part is open (finished, or expired)."""
        held_now, targets, found = False, [], False
        for shard in layout.shards:
            reply = self.index._call(
                self._hold,
                [shard.key("sd"), shard.session(operation_id)],
                [
                    operation_id,
                    layout.instance_id,
                    release_ms,
                    now_us,
                    evidence.last_error,
                    "\n".join(evidence.backend_task_ids),
                    evidence.source_storage_name,
                    evidence.target_storage_name,
                ],
            )
            outcome = HoldResult(int(reply[0]))
            if outcome == HoldResult.UNKNOWN:
                continue
            found = True
            held_now = held_now or outcome == HoldResult.HELD
            targets += session_entries(reply[1] or b"")
        if not found:
            return None
        pipe = self.client.pipeline(transaction=False)
        self.index.queue_session_deadline(pipe, layout.instance_id, release_ms)
        with valkey_errors("index"):
            pipe.execute()
        return held_now, targets

    def add(self, operation: QuarantinedOperation) -> None:
        """Put ``operation`` in the index (both hashes, one transaction; again: the same)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self._operations_key, operation.operation_id, operation.encode())
        pipe.hset(self._group_key(operation.group), operation.operation_id, operation.encode())
        with valkey_errors("index"):
            pipe.execute()

    def forget(self, operations: Sequence[QuarantinedOperation]) -> None:
        """Take released operations out of the index (one transaction)."""
        if not operations:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(self._operations_key, *(op.operation_id for op in operations))
        for op in operations:
            pipe.hdel(self._group_key(op.group), op.operation_id)
        with valkey_errors("index"):
            pipe.execute()

    def find(self, operation_id: str) -> QuarantinedOperation | None:
        """The index's entry for ``operation_id``, or None."""
        with valkey_errors("index"):
            raw = cast(bytes | None, self.client.hget(self._operations_key, operation_id))
        return QuarantinedOperation.decode(operation_id, raw) if raw is not None else None

    def operations(self, group: str | None = None) -> list[QuarantinedOperation]:
        """The listed operations of ``group`` (None: every group), by operation id."""
        key = self._group_key(group) if group is not None else self._operations_key
        with valkey_errors("index"):
            raw = cast(dict[bytes, bytes], self.client.hgetall(key))
        return sorted(
            (QuarantinedOperation.decode(op.decode(), value) for op, value in raw.items()),
            key=lambda op: op.operation_id,
        )

    def parts(self, layouts: Sequence[InstanceLayout], operation_ids: Sequence[str]) -> list[list[QuarantinePart]]:
        """Per (layout, operation id) pair, the session's parts in every shard (those that
        exist), in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for layout, operation_id in zip(layouts, operation_ids, strict=True):
            for shard in layout.shards:
                pipe.hmget(shard.session(operation_id), *_FIELDS)
        with valkey_errors("index"):
            replies = iter(cast(list[list[bytes | None]], pipe.execute()))
        found = []
        for layout in layouts:
            found.append([_part(values) for _ in layout.shards if (values := next(replies))[0] is not None])
        return found


def _part(values: Sequence[bytes | None]) -> QuarantinePart:
    raw = dict(zip(_FIELDS, values, strict=True))

    def text(name: str) -> str:
        return (raw[name] or b"").decode()

    guard = raw["q"]
    tasks = text("qt")
    return QuarantinePart(
        targets=session_entries(raw["k"] or b""),
        sources=session_entries(raw["m"] or b""),
        guard=CopyGuard(int(guard)) if guard is not None else None,
        create_time_us=int(raw["qc"] or 0),
        update_time_us=int(raw["qu"] or 0),
        last_error=text("qe"),
        backend_task_ids=tasks.split("\n") if tasks else [],
        source_storage_name=text("qs"),
        target_storage_name=text("qn"),
        release_ms=int(raw["d"] or 0),
    )
