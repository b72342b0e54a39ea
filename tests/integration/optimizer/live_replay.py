"""A trace replayed through the live data plane, in-process on a manual clock: what
test_live.py (one tier) and test_live_tiers.py (two tiers) share.

The replay drives instance ``i`` of group ``g`` over the wire (the app's routes through
Chalice's test client): per record a getCacheLocation (prefix match), then a
startWriteCache and finishWriteCache of its keys, with the reclaimer's round run every
second of trace time on the way, as the local scheduler runs them. Deletions are inline
(the runtime has no batched_delete state machine: ``InlineDeleter``), so a victim's bytes
and record go in the step that hands it over.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chalice.test import Client

from chalicelib.index import Status
from chalicelib.index.errors import QuotaExceededError
from chalicelib.index.records import decode_record
from chalicelib.index.types import MODE_RAW, Usage
from chalicelib.optimizer.traces import Record
from chalicelib.protocol.codes import MigrationRetention
from chalicelib.storage import BlockRef
from chalicelib.workflows.migrations import COPY_EXECUTION_PREFIX, copy_batches
from tests.helpers import api_caller, register_one_spec_instance

#: The trace's blocks as the engine's: one spec ``tp0`` of this many bytes, 512 tokens a block.
BLOCK_BYTES = 1024
BLOCK_TOKENS = 512


def block_bytes(key: int) -> bytes:
    """The bytes an engine writes for block ``key``: deterministic, distinct per key."""
    digest = hashlib.blake2b(str(key).encode(), digest_size=64).digest()
    return digest * (BLOCK_BYTES // len(digest))


def storage_of(uri: str) -> str:
    """The storage a location URI names (``file://nfs_01/...``, ``s3://s3_01/...``)."""
    return uri.split("://", 1)[1].split("/", 1)[0]


@dataclass
class LiveRun:
    """What the reads of a live replay found: blocks read, and hit blocks per storage."""

    reads: int = 0
    hits_by_storage: Counter[str] = field(default_factory=Counter)
    #: What the caller's checks measured along the run (figures for the report).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float:
        return sum(self.hits_by_storage.values()) / self.reads if self.reads else 0.0

    def storage_hit_ratio(self, storage: str) -> float:
        return self.hits_by_storage[storage] / self.reads if self.reads else 0.0


class EngineWrites:
    """Writes, as an engine does between startWriteCache and finishWriteCache, the bytes
    of every block the start placed (``block_bytes`` of its key) on whichever storage the
    start chose; counts the blocks per storage (``placed``)."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.placed: Counter[str] = Counter()

    def __call__(self, instance_id: str, keys: Sequence[int]) -> None:
        rt = self.runtime
        ctx = rt.contexts(instance_id)
        names = rt.index.storage_names(ctx.layout)
        by_storage: dict[str, list[BlockRef]] = {}
        for key, record in zip(keys, rt.index.read(ctx.layout, keys, MODE_RAW), strict=True):
            for loc in record.locations if record is not None else ():
                if loc.status == Status.WRITING:
                    by_storage.setdefault(names[loc.storage_index], []).append(
                        BlockRef(
                            instance_id,
                            key,
                            loc.location_id,
                            loc.group_id,
                            loc.slot,
                            ctx.spec_layout.slots(loc.spec_group),
                        )
                    )
        for storage, blocks in by_storage.items():
            ctx.backend(storage).write(blocks, [[block_bytes(b.block_key)] for b in blocks])
            self.placed[storage] += len(blocks)


class InProcessCopies:
    """``TierCopies`` for an in-process replay: the reclaimer's tier triggers (``submit``, a
    ``CopySubmitter``) and its demotes (``start``, batches whose sessions the round began)
    have each execution's steps run synchronously in the round that starts it: per batch,
    ``CopyTasks`` begin → copy → finish, exactly the Lambda tasks the tier_copy state machine
    calls, instead of starting it (moto's interpreter runs on the wall clock and would take
    minutes for a trace's thousands of blocks; the ASL is tested in
    tests/integration/workflows). A refused begin (``QuotaExceededError``, the ASL's
    ``Refused``) writes nothing; it is counted in ``results``, as the served and failed
    targets are."""

    def __init__(self, tasks: Any) -> None:
        self.tasks = tasks
        self.executions = 0
        self.results: Counter[str] = Counter()

    def submit(
        self, ctx: Any, source: str, target: str, block_keys: Sequence[int], retention: MigrationRetention
    ) -> str:
        return self.start(ctx, source, target, copy_batches(block_keys), retention)

    def start(
        self,
        ctx: Any,
        source: str,
        target: str,
        batches: Sequence[Sequence[int]],
        retention: MigrationRetention,
        execution_name: str = "",
    ) -> str:
        self.executions += 1
        name = execution_name or f"{COPY_EXECUTION_PREFIX}-inprocess-{self.executions}"
        for batch, keys in enumerate(batches):
            event = {
                "instance_id": ctx.instance_id,
                "source": source,
                "target": target,
                "retention": retention.name,
                "execution": name,
                "batch": batch,
                "block_keys": list(keys),
            }
            try:
                begun = self.tasks.begin(event)
            except QuotaExceededError:
                self.results["refused"] += len(keys)
                continue
            done = self.tasks.finish(self.tasks.copy(begun))
            self.results["served"] += done["served"]
            self.results["failed"] += done["failed"]
        return f"inprocess:{name}"


def replay_live(
    runtime: Any,
    clock: Any,
    records: Iterable[Record],
    on_write: Callable[[str, Sequence[int]], None] | None = None,
    on_hit: Callable[[int, str], None] | None = None,
    after_round: Callable[[], None] | None = None,
) -> LiveRun:
    """Replay ``records`` through instance ``i`` of group ``g`` (``runtime`` installed, the
    group made by the caller), reclaim rounds every second of trace time. ``on_write``
    (instance id, keys) runs between each start and its finish, ``on_hit`` (block key,
    URI) for each block a read found, ``after_round`` after each round."""
    run = LiveRun()
    with Client(__import__("app").app) as client:
        call = api_caller(client)
        register_one_spec_instance(call, BLOCK_TOKENS, BLOCK_BYTES)
        start_s = math.floor(clock.now())
        clock.advance(start_s + 1 - clock.now())  # trace time 0 = a whole second
        base = clock.now()
        next_round = base + 1
        for record in records:
            at = base + record.timestamp_us / 1e6
            while next_round <= at:  # the scheduler's ticks on the way
                clock.advance(next_round - clock.now())
                runtime.reclaim_job.run()
                if after_round is not None:
                    after_round()
                next_round += 1
            clock.advance(at - clock.now())
            keys = list(record.keys)
            found = call("getCacheLocation", {"instance_id": "i", "block_keys": keys, "query_type": "QT_PREFIX_MATCH"})
            for key, location in zip(keys, found["locations"], strict=False):
                uri = location["location_specs"][0]["uri"]
                run.hits_by_storage[storage_of(uri)] += 1
                if on_hit is not None:
                    on_hit(key, uri)
            run.reads += len(keys)
            start = call("startWriteCache", {"instance_id": "i", "block_keys": keys})
            if start["header"]["status"]["code"] == "OK" and start["locations"]:
                if on_write is not None:
                    on_write("i", keys)
                fin = call(
                    "finishWriteCache",
                    {
                        "instance_id": "i",
                        "write_session_id": start["write_session_id"],
                        "success_blocks": {"offset": len(start["locations"])},
                    },
                )
                assert fin["header"]["status"]["code"] == "OK", fin
    return run


def recount(runtime: Any, instance_id: str) -> Usage:
    """The instance's usage recounted from its records (every location's spec group bytes
    by storage type and storage; DELETING ones also in the ``deleting_*`` fields)."""
    ctx = runtime.contexts(instance_id)
    sizes = ctx.spec_layout.sizes
    table = runtime.index.storage_table(ctx.layout)
    totals = Counter[str]()
    by_type, by_storage, deleting_by_type = Counter[str](), Counter[str](), Counter[str]()
    for _, raw in runtime.index.scan(ctx.layout):
        record = decode_record(raw)
        totals["keys"] += 1
        totals["deleting_keys"] += bool(record.locations) and all(
            loc.status == Status.DELETING for loc in record.locations
        )
        for loc in record.locations:
            name, storage_type = table[loc.storage_index]
            size = sizes[loc.spec_group]
            totals["bytes"] += size
            by_type[storage_type] += size
            by_storage[name] += size
            if loc.status == Status.DELETING:
                totals["deleting_bytes"] += size
                deleting_by_type[storage_type] += size
    return Usage(
        totals["bytes"],
        totals["keys"],
        dict(by_type),
        dict(by_storage),
        totals["deleting_bytes"],
        totals["deleting_keys"],
        dict(deleting_by_type),
    )
