"""Purging an instance's blocks in bounded steps: removeInstance and trimCache's
whole-instance strategies.

A purge walks the instance's occupied buckets (``BlockIndex.occupied_page``), a page per
step, so it costs what the instance holds — never the buckets it was sized for. The
API call runs steps inline up to ``INLINE_BLOCKS`` blocks and hands the rest to the
``instance_purge`` state machine, whose task runs ``PurgeService.step`` in a loop; so a
call answers at once whatever the instance's size. Without a state machine (tests,
deployments without workflows) the call runs the purge to its end.

Modes:

- ``instance`` (removeInstance): the control plane marks the instance as being removed
  first (it is unknown to every call from then on, and its id cannot be registered again
  until the purge ends), and the index refuses its writes. Each step marks every location
  of its page DELETING — lost and in-flight deletions included: nothing can write the
  instance again, so no deletion can hit a newer block — and deletes data and records
  inline. When no occupied bucket is left, the rest of the key space goes and the record
  is deleted: a crash at any point leaves an instance still being removed, which the
  watchdog (``resume_removals``) or a new removeInstance call picks up again.
- ``cache`` (TS_REMOVE_ALL_CACHE, TS_TIMESTAMP): blocks written in the job's time range
  (all those written before the call, for REMOVE_ALL_CACHE) are marked DELETING and go
  to the service's deleter after the group's delete delay, like removeCache. Only the
  location read is taken: a block removed and written again meanwhile is left alone.
- ``meta`` (TS_REMOVE_ALL_META): records are forgotten without deleting their data, which
  stays on storage and stays charged to the quota (usage follows the bytes that exist),
  until the instance is removed. Forgotten locations are kept in the index (``T:fg``): the
  removal, once no record is left, deletes their data a chunk per step and releases each
  chunk's charge after its deletion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from ..clock import Clock, now_us
from ..control import ControlPlane
from ..control.records import InstanceRecord
from ..index import BlockIndex, InstanceLayout
from ..index.layout import HEADER
from ..index.records import location_id_at, write_time_ms
from ..observability.logging import logger
from ..protocol.errors import InstanceNotFoundError
from ..stores.reporters import ReporterStore
from .context import InstanceContext
from .contexts import ContextProvider
from .deletion import Deleter, DeletionService

INSTANCE, CACHE, META = "instance", "cache", "meta"
#: Occupied buckets read per step (about 16 blocks each: BlockIndex.RECORDS_PER_BUCKET).
BUCKETS_PER_STEP = 64
#: Blocks an API call purges itself before handing the rest to the state machine.
INLINE_BLOCKS = 2048
#: Victims deleted per index call inside a step.
DELETE_CHUNK = 2048


@dataclass(frozen=True)
class PurgeJob:
    """A purge in progress: the state machine's input and each step's output."""

    instance_id: str
    incarnation: str
    mode: str
    #: Blocks written in [written_from_us, written_to_us] (``cache`` mode only).
    written_from_us: int = 0
    written_to_us: int = 0
    cursor: int = 0
    #: Buckets of the last page not done yet (SSCAN pages are only a hint's size: a small
    #: set comes whole).
    pending: tuple[int, ...] = ()
    #: Per shard, the bucket count the walk covers up to (``cache`` and ``meta`` modes, whose
    #: instance may be written and its buckets split meanwhile: ``_pass_end``), and the
    #: first bucket of the split-off ones being read (empty: the occupied-bucket walk).
    bucket_counts: tuple[int, ...] = ()
    split_from: tuple[int, ...] = ()
    steps: int = 0
    blocks: int = 0
    done: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "pending": list(self.pending),
            "bucket_counts": list(self.bucket_counts),
            "split_from": list(self.split_from),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PurgeJob:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        fields["pending"] = tuple(fields.get("pending", ()))
        for name in ("bucket_counts", "split_from"):
            fields[name] = tuple(fields.get(name, ()))
        return cls(**fields)

    def covers(self, raw: bytes) -> bool:
        """Whether a record is this job's to take."""
        if self.mode != CACHE:
            return True
        written_us = write_time_ms(raw) * 1000
        return self.written_from_us <= written_us <= self.written_to_us


def _first_location(raw: bytes) -> int:
    # A record holds one location (lua/start.lua creates it with one, nothing adds any).
    return location_id_at(raw, HEADER.size)


class FeedStreams(Protocol):
    """Where the instances' hit-feed streams are (``workflows.hit_curves.HitCurveStore``)."""

    def drop_streams(self, instances: list[str]) -> None:
        """Delete the streams of ``instances``."""


class PurgeService:
    """Runs purges; ``start_execution(job_json)`` hands one to the state machine (None:
    there is none, purges run inline to their end)."""

    def __init__(
        self,
        index: BlockIndex,
        control: ControlPlane,
        contexts: ContextProvider,
        deletion: DeletionService,
        deleter: Deleter,
        clock: Clock,
        start_execution: Callable[[dict[str, Any]], object] | None = None,
        reported: ReporterStore | None = None,
        feeds: FeedStreams | None = None,
    ) -> None:
        #: What engines reported for the instance goes with it (reportEvent), and so does
        #: its hit-feed stream (``observability.hit_feed``).
        self.reported = reported
        self.feeds = feeds
        self.index = index
        self.control = control
        self.contexts = contexts
        self.deletion = deletion
        self.deleter = deleter
        self.clock = clock
        self.start_execution = start_execution

    # ---------------------------------------------------------------- entry points

    def remove_instance(self, instance_id: str, group: str = "") -> PurgeJob:
        """removeInstance: mark the instance as being removed, then purge it (inline up to
        ``INLINE_BLOCKS``, the rest in the state machine). Calling it again for an instance
        already being removed resumes its purge."""
        record = self.control.begin_instance_removal(instance_id, group)
        self.contexts.forget(instance_id)
        return self.run(PurgeJob(instance_id, record.incarnation, INSTANCE))

    def trim(self, ctx: InstanceContext, mode: str, written_us: tuple[int, int] = (0, 0)) -> PurgeJob:
        """trimCache's whole-instance strategies (see the module docstring)."""
        incarnation = ctx.layout.incarnation
        return self.run(PurgeJob(ctx.instance_id, incarnation, mode, written_us[0], written_us[1]))

    def run(self, job: PurgeJob) -> PurgeJob:
        """Steps inline until done or ``INLINE_BLOCKS`` are purged, then hands over."""
        while not job.done:
            if job.blocks >= INLINE_BLOCKS and self.start_execution is not None:
                self.start_execution(job.to_json())
                logger.info(
                    "purge handed to the state machine",
                    extra={"instance_id": job.instance_id, "mode": job.mode, "blocks": job.blocks},
                )
                return job
            job = self.step(job)
        return job

    def resume_removals(self) -> list[str]:
        """Start the purge of every instance still being removed (the watchdog: a removal
        whose execution failed or whose container died). Returns their ids."""
        resumed = []
        for record in self.control.list_instances(removing=True):
            self.run(PurgeJob(record.instance_id, record.incarnation, INSTANCE))
            resumed.append(record.instance_id)
        return resumed

    # ---------------------------------------------------------------- one step

    def step(self, job: PurgeJob) -> PurgeJob:
        """One page of occupied buckets; the job as it stands after it."""
        record = self.control.get_instance(job.instance_id)
        if record is None or record.incarnation != job.incarnation:
            return replace(job, done=True)  # finished already, or another registration now
        if job.mode == INSTANCE and not record.removing_us:
            raise InstanceNotFoundError(f"instance '{job.instance_id}' is not being removed")
        ctx = self.contexts.build(record)
        layout = ctx.layout
        if job.mode == INSTANCE:
            self.index.set_removing(layout, True)  # again: the call that set it may have died first
        cursor, pending = job.cursor, job.pending
        if job.mode != INSTANCE and not job.bucket_counts:
            job = replace(job, bucket_counts=tuple(self.index.bucket_counts(layout)))
        if not pending:
            cursor, page = self.index.occupied_page(layout, cursor, BUCKETS_PER_STEP)
            pending = tuple(page)
        buckets, pending = pending[:BUCKETS_PER_STEP], pending[BUCKETS_PER_STEP:]
        picked = [(key, raw) for key, raw in self.index.read_buckets(layout, buckets) if job.covers(raw)]
        keys = [key for key, _ in picked]
        locations = [_first_location(raw) for _, raw in picked]
        if job.mode == META:
            self.index.forget(layout, keys, locations)
        elif keys:
            self._delete(ctx, job, keys, locations)
        job = replace(job, cursor=cursor, pending=pending, steps=job.steps + 1, blocks=job.blocks + len(keys))
        if cursor != 0 or pending:
            return job
        if job.mode != INSTANCE:
            return self._pass_end(job, layout)
        if self.index.occupied_count(layout) > 0:
            return job  # blocks left (written before the flag, or a deletion that failed): another pass
        if self.deletion.delete_forgotten(ctx, DELETE_CHUNK):
            return job  # forgotten data deleted, its charge released: the next chunk in the next step
        self._finish_removal(ctx, record)
        return replace(job, done=True)

    def _pass_end(self, job: PurgeJob, layout: InstanceLayout) -> PurgeJob:
        """A trim's walk is over, while starts may have split buckets meanwhile. The walk of
        the occupied set returned every bucket occupied throughout, but a split moves
        records of a bucket it had not reached yet to a new bucket, which it may have
        missed: the buckets split off since the walk began are read next. Reading those
        may race further splits in turn; another such read is needed only if one took
        records from a bucket of the last one (a record moves again only once its
        instance has doubled)."""
        counts, split_off = self.index.split_since(layout, job.bucket_counts, job.split_from)
        if not split_off:
            return replace(job, done=True)
        return replace(job, pending=tuple(split_off), bucket_counts=tuple(counts), split_from=job.bucket_counts)

    def _delete(self, ctx: InstanceContext, job: PurgeJob, keys: list[int], locations: list[int]) -> None:
        delay_ms = ctx.delete_delay_ms
        # A removal takes every DELETING location too: nothing can write the instance any more.
        resubmit = self.index.EVERY_DELETION if job.mode == INSTANCE else int(self.clock.now())
        victims = self.index.mark_deleting(
            ctx.layout,
            keys,
            ctx.spec_layout.sizes,
            expected_locations=locations,
            resubmit_before_s=resubmit,
            delay_ms=delay_ms,
        )
        if job.mode == INSTANCE:
            for start in range(0, len(victims), DELETE_CHUNK):
                self.deletion.delete(ctx, victims[start : start + DELETE_CHUNK])
        else:
            self.deleter.submit(ctx, victims, delay_ms)

    def _finish_removal(self, ctx: InstanceContext, record: InstanceRecord) -> None:
        self.deletion.delete_orphan_groups(ctx)
        self.index.drop_all(ctx.layout)
        if self.reported is not None:
            self.reported.forget_instance(ctx.instance_id)
        if self.feeds is not None:
            self.feeds.drop_streams([ctx.instance_id])
        self.index.set_removing(ctx.layout, False)
        try:
            self.control.remove_instance(record.instance_id, record.incarnation)
        except InstanceNotFoundError:
            pass  # another step finished it first
        self.contexts.forget(record.instance_id)
        logger.info(
            "instance removed",
            extra={
                "instance_id": record.instance_id,
                "removal_s": round((now_us(self.clock) - record.removing_us) / 1e6, 3),
            },
        )
