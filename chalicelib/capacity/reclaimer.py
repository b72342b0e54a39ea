"""The reclaimer: rounds over the instance groups, the scheduled entry point and the wake
hook.

A round looks at a group when it is due: woken by a refused write (``request_reclaim``),
still over its watermark after the previous round, or ``trigger_period_seconds`` after
its last look. It then reads the usage of the group's instances (one round trip), credits
what earlier rounds marked and is not deleted yet, decides what to free
(``watermark.assess``), spreads that over the instances in proportion to their usage and
frees it by sampling (``instance.InstanceReclaim``). With ``POLICY_TTL`` and
``ttl_seconds`` each look also sweeps part of every instance for expired blocks, and every
look sweeps part of every instance for deletions that never finished (``stranded``).

Only the holder of the background lease reclaims (``reclaim_handler``).
"""
from __future__ import annotations

import random
import threading
import time
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence

from ..clock import Clock, now_us
from ..control.groups import DEFAULT_TRIGGER_PERIOD_S
from ..index import BlockIndex, Victim
from ..observability.logging import logger
from ..protocol.errors import InstanceNotFoundError
from ..protocol.models import InstanceGroup
from .instance import InstanceReclaim, InstanceReport, Submit
from .pending import PendingDeletions
from .policies import Candidate, policy_for
from .sampling import BucketSampler, SamplingConfig, sweep_buckets
from .stranded import PASS_S, stranded_locations
from .watermark import Limits, Need, Plan, assess, credit, split

if TYPE_CHECKING:
    from ..cache.context import InstanceContext
    from ..cache.deletion import Deleter
    from ..observability.events import EventLog
    from ..observability.metrics import MetricsRegistry

#: A refused write wakes a group at most this often per container: one SADD, not one per
#: refused call of a client retrying in a loop.
WAKE_DEBOUNCE_S = 0.5


class GroupDirectory(Protocol):
    def groups(self) -> list[tuple[InstanceGroup, list[str]]]:
        """Every group with the ids of its instances."""


class ControlDirectory:
    """Groups and their instances from the control plane: two queries per round."""

    def __init__(self, control: Any) -> None:
        self.control = control

    def groups(self) -> list[tuple[InstanceGroup, list[str]]]:
        ids: dict[str, list[str]] = defaultdict(list)
        for record in self.control.list_instances():
            ids[record.group].append(record.instance_id)
        return [(g, ids[g.name]) for g in self.control.list_groups() if ids.get(g.name)]


@dataclass
class GroupReport:
    """What a round did in one group."""

    group: str
    #: Why the group was looked at: ``woken``, ``over`` (still over after the last
    #: round) or ``period``.
    reason: str
    plan: Plan = field(default_factory=Plan)
    swept: bool = False
    #: Stranded deletions handed to deletion again.
    resubmitted: int = 0
    instances: list[InstanceReport] = field(default_factory=list)
    error: str = ""

    @property
    def victims(self) -> int:
        return sum(r.victims for r in self.instances)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.instances)

    def to_dict(self) -> dict:
        return {"group": self.group, "reason": self.reason, "swept": self.swept, "resubmitted": self.resubmitted,
                "victims": self.victims, "bytes": self.bytes, "error": self.error,
                "plan": {"bytes": self.plan.bytes, "by_type": dict(self.plan.by_type), "keys": dict(self.plan.keys)},
                "instances": [r.to_dict() for r in self.instances]}


@dataclass
class ReclaimReport:
    """One round."""

    groups: list[GroupReport] = field(default_factory=list)
    duration_ms: float = 0.0
    #: Why the round did nothing (e.g. another node holds the lease).
    skipped: str = ""
    #: The lease was lost midway: the remaining groups wait for the next round.
    interrupted: bool = False

    @property
    def victims(self) -> int:
        return sum(g.victims for g in self.groups)

    @property
    def bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    def to_dict(self) -> dict:
        return {"victims": self.victims, "bytes": self.bytes, "duration_ms": round(self.duration_ms, 3),
                "skipped": self.skipped, "interrupted": self.interrupted,
                "groups": [g.to_dict() for g in self.groups]}


@dataclass
class _GroupState:
    next_check: float = float("-inf")
    next_sweep: float = float("-inf")
    over: bool = False


class Reclaimer:
    """Runs reclaim rounds. Keeps, between rounds, when each group is due and what it
    marked that is not deleted yet; so one Reclaimer per process (``reclaim_handler``
    keeps it on the runtime)."""

    def __init__(self, index: BlockIndex, directory: GroupDirectory,
                 contexts: Callable[[str], "InstanceContext"], deleter: "Deleter", clock: Clock,
                 events: Optional["EventLog"] = None, metrics: Optional["MetricsRegistry"] = None,
                 rng: Optional[random.Random] = None, config: SamplingConfig = SamplingConfig()) -> None:
        self.index = index
        self.directory = directory
        self.contexts = contexts
        self.deleter = deleter
        self.clock = clock
        self.events = events
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.config = config
        self.pending = PendingDeletions()
        self._states: dict[str, _GroupState] = {}

    @classmethod
    def from_runtime(cls, runtime: Any, rng: Optional[random.Random] = None,
                     config: SamplingConfig = SamplingConfig()) -> "Reclaimer":
        """A reclaimer over the runtime's index, control plane, contexts and deleter."""
        return cls(runtime.index, ControlDirectory(runtime.control), runtime.contexts, runtime.deleter,
                   runtime.clock, events=runtime.events, metrics=runtime.metrics, rng=rng, config=config)

    def run_round(self, keep_going: Callable[[], bool] = lambda: True) -> ReclaimReport:
        """Look at every due group and free what is over its watermark (and, with TTL,
        what expired). ``keep_going`` is asked before each group (the lease)."""
        started = time.perf_counter()
        now = self.clock.now()
        listing = self.directory.groups()
        woken = self.index.take_reclaim_requests()
        self.pending.retain({i for _, ids in listing for i in ids})
        self._states = {g.name: self._states.get(g.name, _GroupState()) for g, _ in listing}
        report = ReclaimReport()
        for group, instance_ids in listing:
            state = self._states[group.name]
            reason = ("woken" if group.name in woken else "over" if state.over
                      else "period" if now >= state.next_check else "")
            if not reason:
                continue
            if not keep_going():
                report.interrupted = True
                break
            report.groups.append(self._reclaim_group(group, instance_ids, state, now, reason))
        report.duration_ms = (time.perf_counter() - started) * 1000
        if self.metrics is not None:
            self.metrics.incr("cache_reclaimer.reclaim_cron_count")
            self.metrics.observe("cache_reclaimer.reclaim_cron_duration_us", report.duration_ms * 1000)
        return report

    def _reclaim_group(self, group: InstanceGroup, instance_ids: Sequence[str], state: _GroupState, now: float,
                       reason: str) -> GroupReport:
        report = GroupReport(group.name, reason)
        strategy = group.cache_config.reclaim_strategy if group.cache_config is not None else None
        period = (strategy.trigger_period_seconds if strategy is not None and strategy.trigger_period_seconds > 0
                  else DEFAULT_TRIGGER_PERIOD_S)
        state.next_check = now + period
        try:
            contexts = self._contexts(instance_ids)
            usages = self.index.usage([c.layout for c in contexts])
            credited = {c.instance_id: credit(u, self.pending.outstanding(self.index, c.layout, c.instance_id))
                        for c, u in zip(contexts, usages)}
            report.plan = assess(Limits.of(group), credited, pressure=reason == "woken")
            needs = split(report.plan, credited)
            policy = policy_for(strategy, self.index.LFU_DECAY_S)
            report.swept = policy.expires and now >= state.next_sweep
            if report.swept:
                state.next_sweep = now + period
            delay_ms = strategy.delay_before_delete_ms if strategy is not None else 0
            storage_name = strategy.storage_unique_name if strategy is not None else ""
            submit = self._submitter(group.name, delay_ms)
            lost_before_s = self.index.lost_deletions_before_s(delay_ms)
            for ctx in contexts:
                report.resubmitted += self._resubmit_stranded(ctx, period, lost_before_s)
            for ctx, usage in zip(contexts, usages):
                need = needs.get(ctx.instance_id)
                if need is None and not report.swept:
                    continue
                sampler = BucketSampler(self.index, ctx.layout, self.index.storage_table(ctx.layout),
                                        ctx.spec_layout.sizes, self.rng, self.config, storage_name)
                window = (sweep_buckets(ctx.layout.bucket_count, period, strategy.ttl_seconds, self.config)
                          if report.swept else 0)
                work = InstanceReclaim(self.index, ctx, policy, need or Need(), sampler, self.config, int(now),
                                       submit, blocks_hint=usage.keys)
                report.instances.append(work.run(window))
        except Exception as exc:  # noqa: BLE001 - one failing group must not stop the others
            logger.exception("reclaim of instance group %s failed", group.name)
            report.error = f"{type(exc).__name__}: {exc}"
        # Keep going next round only while it helps: a group over its watermark whose
        # blocks are all in flight would otherwise be sampled every round for nothing.
        state.over = report.plan.needed and report.victims > 0
        return report

    def _resubmit_stranded(self, ctx: "InstanceContext", period_s: int, lost_before_s: int) -> int:
        """Hand the deletions of the next buckets of the instance's stranded sweep that
        never finished to the deleter again (see ``stranded``); returns how many. A
        deletion failing again is logged: it must not stop the group's reclaim."""
        window = self.index.advance_sweep(
            ctx.layout, sweep_buckets(ctx.layout.bucket_count, period_s, PASS_S, self.config), cursor="stranded")
        step = self.config.buckets_per_trip
        found = [entry for i in range(0, len(window), step)
                 for entry in stranded_locations(self.index.sample_buckets(ctx.layout, window[i:i + step]),
                                                 lost_before_s)]
        if not found:
            return 0
        # Through the mark script: only what is still lost is taken, and stamped again, so
        # a removeCache right after this cannot hand the same deletion over a second time.
        victims = self.index.mark_deleting(ctx.layout, [key for key, _ in found],
                                           expected_locations=[location for _, location in found],
                                           resubmit_before_s=lost_before_s)
        if not victims:
            return 0
        try:
            self.deleter.submit(ctx, victims)
        except Exception as exc:  # noqa: BLE001 - one instance's storage must not stop the group's reclaim
            logger.warning("stranded deletions failed again", extra={
                "instance_id": ctx.instance_id, "locations": len(victims), "error": str(exc)})
            return 0
        if self.metrics is not None:
            self.metrics.incr("cache_reclaimer.stranded_resubmit_count", len(victims),
                              {"instance_group": ctx.group.name})
        return len(victims)

    def _contexts(self, instance_ids: Sequence[str]) -> list["InstanceContext"]:
        out = []
        for instance_id in instance_ids:
            try:
                out.append(self.contexts(instance_id))
            except InstanceNotFoundError:
                continue  # removed since the listing
        return out

    def _submitter(self, group: str, delay_ms: int) -> Submit:
        def submit(ctx: "InstanceContext", taken: Sequence[tuple[Victim, Candidate]]) -> None:
            # Remembered before the hand-over: if it fails the locations stay DELETING,
            # and must not be reclaimed a second time meanwhile.
            self.pending.add(ctx.instance_id, [(v.block_key, v.location_id, c.size, c.storage_type)
                                               for v, c in taken])
            victims = [v for v, _ in taken]
            self.deleter.submit(ctx, victims, delay_ms)
            if self.events is not None:
                self.events.publish(ctx.instance_id, "CacheReclaimSubmit", now_us(self.clock),
                                    block_keys=[v.block_key for v in victims],
                                    location_ids=[[str(v.location_id)] for v in victims], delay_us=delay_ms * 1000)
            if self.metrics is not None:
                self.metrics.incr("cache_reclaimer.block_submit_count", len(victims), {"instance_group": group})
        return submit


# ---------------------------------------------------------------- entry points


def _always() -> bool:
    return True


class _LeaseGuard:
    """The background lease during a round: renewed once a third of its ttl has passed."""

    def __init__(self, lease: Any, clock: Clock) -> None:
        self.lease = lease
        self.clock = clock
        self._checked = float("-inf")

    def acquire(self) -> bool:
        """Take or extend the lease; False when another node holds it."""
        self._checked = self.clock.now()
        return bool(self.lease.try_acquire())

    def held(self) -> bool:
        now = self.clock.now()
        if now - self._checked < self.lease.ttl_ms / 3000:
            return True
        self._checked = now
        return bool(self.lease.renew())


class _ProcessState:
    """What one process keeps for a runtime between rounds and wake-ups."""

    def __init__(self) -> None:
        self.round_lock = threading.Lock()
        self.reclaimer: Optional[Reclaimer] = None
        self.woken_at: dict[str, float] = {}


_STATES: "weakref.WeakKeyDictionary[Any, _ProcessState]" = weakref.WeakKeyDictionary()
_STATES_LOCK = threading.Lock()


def _state_of(runtime: Any) -> _ProcessState:
    with _STATES_LOCK:
        state = _STATES.get(runtime)
        if state is None:
            state = _STATES[runtime] = _ProcessState()
        return state


def reclaim_handler(runtime: Any) -> dict:
    """One reclaim round: what app.py's ``@app.schedule`` handler and the local scheduler
    (every second) call. Runs only while this node holds the background lease (when the
    runtime has one) and never two rounds at once in a process. Returns the round's
    report as a dict (``skipped`` says why a round did nothing)."""
    state = _state_of(runtime)
    if not state.round_lock.acquire(blocking=False):
        return ReclaimReport(skipped="a reclaim round is already running in this process").to_dict()
    try:
        lease = getattr(runtime, "lease", None)
        guard = _LeaseGuard(lease, runtime.clock) if lease is not None else None
        if guard is not None and not guard.acquire():
            return ReclaimReport(skipped="another node holds the background lease").to_dict()
        if state.reclaimer is None:
            state.reclaimer = Reclaimer.from_runtime(runtime)
        report = state.reclaimer.run_round(guard.held if guard is not None else _always)
        if report.victims or any(g.error for g in report.groups):
            logger.info("reclaim round", extra={"victims": report.victims, "bytes": report.bytes,
                                                "duration_ms": round(report.duration_ms, 1),
                                                "errors": [g.error for g in report.groups if g.error]})
        return report.to_dict()
    finally:
        state.round_lock.release()


def request_reclaim(runtime: Any, group_name: str) -> None:
    """Wake the reclaimer for ``group_name``: the data plane calls this when a write is
    refused for capacity. The group is looked at in the next round, whatever its
    ``trigger_period_seconds``, with at least one reclaim step of headroom made under each
    hard limit. Cheap (one SADD, at most every ``WAKE_DEBOUNCE_S`` per group and
    process) and never raises."""
    try:
        state = _state_of(runtime)
        now = runtime.clock.now()
        last = state.woken_at.get(group_name)
        if last is not None and 0 <= now - last < WAKE_DEBOUNCE_S:
            return
        state.woken_at[group_name] = now
        runtime.index.request_reclaim(group_name)
    except Exception:  # noqa: BLE001 - a wake-up is best effort; the periodic check follows anyway
        logger.warning("could not wake the reclaimer for instance group %s", group_name, exc_info=True)
