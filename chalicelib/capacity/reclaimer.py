"""The reclaimer: rounds over the instance groups, the scheduled entry point and the wake
hook.

A round costs what needs doing, not the number of instances. It reads every group's
summed usage (one round trip, ``BlockIndex.group_usage``) and looks at a group when it is
due: woken by a refused write (``request_reclaim``), still over its watermark after the
previous round, its limits changed since its last look (a watermark lowered by
updateInstanceGroup is acted on in the next round, not a period later), or
``trigger_period_seconds`` after its last look. Only a group over its
watermark (or with a per-instance key cap, or expiring by TTL) has its instances listed
and their usage read; the need is spread over them in proportion to their usage and freed
by sampling (``instance.InstanceReclaim``). Usage counts live bytes: what is marked
DELETING already counts as freed (the index's deleting counters), so a round never frees
the same excess twice, whichever node ran the round before.

Bounded background work rides along: the TTL sweep visits a few instances of a group per
look, the deletions whose hand-off was lost are handed over again (``stranded``: what is
due, never a scan of the instances), and one group's counters are reconciled with its
instances' per round at most (``RECONCILE_S`` apart per group).

Only the holder of the background lease reclaims (``ReclaimJob``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..cache.marks import spec_group_coverage
from ..clock import Clock, now_us
from ..control import ControlPlane
from ..index import BlockIndex, InstanceLayout, Usage, Victim
from ..observability.logging import logger
from ..protocol.codes import InstanceReclaimBudgetPolicy, MigrationRetention
from ..protocol.errors import InstanceNotFoundError
from ..protocol.models import DEFAULT_TRIGGER_PERIOD_S, InstanceGroup, MigrationStrategy
from ..stores.lease import Lease
from .coldest import coldest_blocks
from .instance import Demoter, InstanceReclaim, InstanceReport, Member, PooledReclaim, Submit, sample_shares
from .policies import Candidate, LRUPolicy, policy_for
from .sampling import BucketSampler, Coverage, SamplingConfig, sweep_buckets
from .stranded import StrandedDeletions
from .watermark import Limits, Need, Plan, assess, own_needs, split

if TYPE_CHECKING:
    from ..cache.context import InstanceContext
    from ..cache.deletion import Deleter
    from ..observability.events import EventLog
    from ..observability.metrics import MetricsRegistry

#: A refused write wakes a group at most this often per container: one SADD, not one per
#: refused call of a client retrying in a loop.
WAKE_DEBOUNCE_S = 0.5
#: Instances of a TTL group swept for expired blocks per look.
TTL_INSTANCES_PER_LOOK = 16
#: A group's counters are checked against its instances' at most this often.
RECONCILE_S = 60
#: How long the directory's instance lists are reused.
MEMBERS_TTL_S = 10.0
#: Blocks a tier trigger submits per strategy and round, over the group's instances: eight
#: of tier_copy's 64-block batches, and a sample of 5 × 512 candidates stays within one
#: instance's bucket budget (``SamplingConfig.max_pool``), so a round's trigger costs at most
#: one reclaim-sized sample per instance. A group far over its threshold drains at this pace
#: per round (every second locally, every minute on AWS) while the Map copies
#: ``copy_max_concurrency`` batches at a time.
TRIGGER_BLOCKS_PER_ROUND = 512
#: ``type_usage / type_quota`` may fall this short of ``trigger_threshold`` (upstream's tolerance).
TRIGGER_TOLERANCE = 1e-9


class CopySubmitter(Protocol):
    def submit(
        self,
        ctx: InstanceContext,
        source: str,
        target: str,
        block_keys: Sequence[int],
        retention: MigrationRetention,
    ) -> str:
        """Start copying ``block_keys`` of ``ctx`` from storage ``source`` to ``target``
        (``workflows.migrations.TierCopies``); returns the execution's ARN."""


class GroupDirectory(Protocol):
    def groups(self) -> list[InstanceGroup]:
        """Every instance group."""

    def members(self, group: str, fresh: bool = False) -> list[str]:
        """The ids of a group's instances; ``fresh``: listed now, never from a reused
        listing (what a group's counters are corrected against)."""


class ControlDirectory:
    """Groups and their instances from the control plane; instance lists are reused for
    ``MEMBERS_TTL_S`` (a round must not list every instance every second)."""

    def __init__(self, control: ControlPlane, clock: Clock) -> None:
        self.control = control
        self.clock = clock
        self._listing: tuple[float, dict[str, list[str]]] = (float("-inf"), {})

    def groups(self) -> list[InstanceGroup]:
        return self.control.list_groups()

    def _members(self) -> dict[str, list[str]]:
        until, members = self._listing
        now = self.clock.now()
        if now >= until:
            members = {}
            for record in self.control.list_instances():
                members.setdefault(record.group, []).append(record.instance_id)
            self._listing = (now + MEMBERS_TTL_S, members)
        return members

    def members(self, group: str, fresh: bool = False) -> list[str]:
        if fresh:
            return [record.instance_id for record in self.control.list_instances(group)]
        return list(self._members().get(group, ()))


@dataclass
class GroupReport:
    """What a round did in one group."""

    group: str
    #: Why the group was looked at: ``woken``, ``over`` (still over after the last
    #: round), ``changed`` (its limits differ from those of its last look) or ``period``.
    reason: str
    plan: Plan = field(default_factory=Plan)
    swept: bool = False
    instances: list[InstanceReport] = field(default_factory=list)
    #: The tier triggers' copies started this round.
    copies: list[CopySubmission] = field(default_factory=list)
    error: str = ""

    @property
    def victims(self) -> int:
        return sum(r.victims for r in self.instances)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.instances)

    @property
    def demoted(self) -> int:
        return sum(r.demoted for r in self.instances)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "reason": self.reason,
            "swept": self.swept,
            "victims": self.victims,
            "bytes": self.bytes,
            "demoted": self.demoted,
            "error": self.error,
            "plan": {"bytes": self.plan.bytes, "by_type": dict(self.plan.by_type), "keys": dict(self.plan.keys)},
            "instances": [r.to_dict() for r in self.instances],
            "copies": [asdict(c) for c in self.copies],
        }


@dataclass(frozen=True)
class CopySubmission:
    """One Copy a tier trigger started: ``blocks`` of an instance along a strategy's route."""

    instance_id: str
    source: str
    target: str
    blocks: int
    execution_arn: str


@dataclass
class ReclaimReport:
    """One round."""

    groups: list[GroupReport] = field(default_factory=list)
    duration_ms: float = 0.0
    #: Victims the write path queued, handed to deletion.
    handed_over: int = 0
    #: Stranded deletions handed to deletion again.
    resubmitted: int = 0
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "victims": self.victims,
            "bytes": self.bytes,
            "duration_ms": round(self.duration_ms, 3),
            "resubmitted": self.resubmitted,
            "handed_over": self.handed_over,
            "skipped": self.skipped,
            "interrupted": self.interrupted,
            "groups": [g.to_dict() for g in self.groups],
        }


@dataclass
class _GroupState:
    next_check: float = float("-inf")
    next_sweep: float = float("-inf")
    next_reconcile: float = float("-inf")
    over: bool = False
    #: The limits of the last look (None: not looked at by this process yet).
    limits: Limits | None = None
    #: Where the next TTL sweep starts among the group's instances.
    sweep_position: int = 0


class Reclaimer:
    """Runs reclaim rounds. Keeps, between rounds, when each group is due and where the
    rotating sweeps are; so one Reclaimer per process (``Runtime.reclaim_job`` keeps it)."""

    def __init__(
        self,
        index: BlockIndex,
        directory: GroupDirectory,
        contexts: Callable[[str], InstanceContext],
        deleter: Deleter,
        clock: Clock,
        events: EventLog | None = None,
        metrics: MetricsRegistry | None = None,
        rng: random.Random | None = None,
        config: SamplingConfig = SamplingConfig(),
        copies: CopySubmitter | None = None,
        demoter: Demoter | None = None,
    ) -> None:
        self.index = index
        self.directory = directory
        self.copies = copies
        self.demoter = demoter
        self.contexts = contexts
        self.deleter = deleter
        self.clock = clock
        self.events = events
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.config = config
        self._states: dict[str, _GroupState] = {}
        self.stranded = StrandedDeletions(index, contexts, deleter, clock, metrics)

    def run_round(self, keep_going: Callable[[], bool] = lambda: True) -> ReclaimReport:
        """Look at every due group and free what is over its watermark (and, with TTL,
        what expired). ``keep_going`` is asked before each group (the lease)."""
        started = time.perf_counter()
        now = self.clock.now()
        groups = self.directory.groups()
        woken = self.index.take_reclaim_requests()
        usages = dict(zip((g.name for g in groups), self.index.group_usage([g.name for g in groups]), strict=True))
        self._states = {g.name: self._states.get(g.name, _GroupState()) for g in groups}
        report = ReclaimReport(handed_over=self._hand_over_queued())
        for group in groups:
            state = self._states[group.name]
            limits = Limits.of(group)
            reason = (
                "woken"
                if group.name in woken
                else "over"
                if state.over
                else "changed"
                if state.limits is not None and limits != state.limits
                else "period"
                if now >= state.next_check
                else ""
            )
            if not reason:
                continue
            if not keep_going():
                report.interrupted = True
                break
            looked = self._reclaim_group(group, limits, usages[group.name], state, now, reason)
            if not looked.error:
                self._trigger_copies(group, limits, usages[group.name], looked, now)
            report.groups.append(looked)
        if not report.interrupted and keep_going():
            report.resubmitted = self.stranded.recover()
            self._reconcile_one(groups, now)
        report.duration_ms = (time.perf_counter() - started) * 1000
        if self.metrics is not None:
            self.metrics.incr("cache_reclaimer.reclaim_cron_count")
            self.metrics.observe("cache_reclaimer.reclaim_cron_duration_us", report.duration_ms * 1000)
            self.metrics.gauge("cache_reclaimer.last_round_time_s", now)
        return report

    def _reclaim_group(
        self, group: InstanceGroup, limits: Limits, usage: Usage, state: _GroupState, now: float, reason: str
    ) -> GroupReport:
        report = GroupReport(group.name, reason)
        strategy = group.cache_config.reclaim_strategy if group.cache_config is not None else None
        period = (
            strategy.trigger_period_seconds
            if strategy is not None and strategy.trigger_period_seconds > 0
            else DEFAULT_TRIGGER_PERIOD_S
        )
        state.next_check = now + period
        state.limits = limits
        pressure = reason == "woken"
        policy = policy_for(strategy, self.index.LFU_DECAY_S)
        report.swept = policy.expires and now >= state.next_sweep
        try:
            # The group's own counters decide whether its instances need reading at all.
            if not (
                assess(limits, {"": usage.live()}, pressure).needed
                or limits.max_keys > 0
                or limits.instance_capacity
                or report.swept
            ):
                state.over = False
                return report
            contexts = self._contexts(self.directory.members(group.name))
            usage_of = self.index.usage([c.layout for c in contexts])
            # A demote's bytes count as freed from its copy's begin to its end.
            live = {c.instance_id: u.reclaimable() for c, u in zip(contexts, usage_of, strict=True)}
            report.plan = assess(limits, live, pressure)
            if report.swept:
                state.next_sweep = now + period
            swept = self._sweep_share(contexts, state) if report.swept else set()
            # Each instance's turn comes every `rotation` looks: its window covers that many.
            rotation = -(-len(contexts) // TTL_INSTANCES_PER_LOOK) if contexts else 1
            delay_ms = strategy.delay_before_delete_ms if strategy is not None else 0
            storage_name = strategy.storage_unique_name if strategy is not None else ""
            submit = submitter(self.deleter, self.clock, group.name, delay_ms, self.events, self.metrics)
            budget = strategy.budget_policy() if strategy is not None else InstanceReclaimBudgetPolicy.GROUP_LRU
            demotes = _demotes(group) if self.demoter is not None else {}
            reports: dict[str, InstanceReport] = {}
            if budget == InstanceReclaimBudgetPolicy.GROUP_LRU and isinstance(policy, LRUPolicy):
                reports = self._group_lru(
                    group.name, contexts, live, report.plan, policy, storage_name, now, submit, demotes
                )
                needs = own_needs(report.plan)
                for instance_id, freed in reports.items():  # the group's victims count towards each own need
                    if instance_id in needs:
                        needs[instance_id].bytes = max(0, needs[instance_id].bytes - freed.bytes)
                        needs[instance_id].keys = max(0, needs[instance_id].keys - freed.victims)
            else:
                needs = split(report.plan, live, even=budget == InstanceReclaimBudgetPolicy.FIXED_PER_INSTANCE)
            for ctx in contexts:
                need = needs.get(ctx.instance_id)
                sweeping = ctx.instance_id in swept
                if (need is None or not need.pending) and not sweeping:
                    continue
                sampler = self._sampler(ctx, storage_name, report.plan)
                work = InstanceReclaim(
                    self.index,
                    ctx,
                    policy,
                    need or Need(),
                    sampler,
                    self.config,
                    int(now),
                    submit,
                    blocks_hint=live[ctx.instance_id].keys,
                    demotes=demotes,
                    demoter=self.demoter,
                )
                window = (
                    sweep_buckets(sampler.occupied, period * rotation, strategy.ttl_seconds, self.config)
                    if sweeping and strategy is not None
                    else 0
                )
                done = work.run(window)
                reports[ctx.instance_id] = reports[ctx.instance_id].add(done) if ctx.instance_id in reports else done
            report.instances = list(reports.values())
        except Exception as exc:  # noqa: BLE001 - one failing group must not stop the others
            logger.exception("reclaim of instance group %s failed", group.name)
            report.error = f"{type(exc).__name__}: {exc}"
        # Keep going next round only while it helps: a group over its watermark whose
        # blocks are all in flight would otherwise be sampled every round for nothing.
        state.over = report.plan.needed and (report.victims > 0 or report.demoted > 0)
        return report

    def _trigger_copies(
        self, group: InstanceGroup, limits: Limits, usage: Usage, report: GroupReport, now: float
    ) -> None:
        """Per copy strategy whose source type is at its ``trigger_threshold`` (live bytes of
        the type over its positive ``quota_config`` capacity, after this round's reclaim),
        submit the coldest blocks held SERVING on the source to the strategy's target, at
        most ``TRIGGER_BLOCKS_PER_ROUND`` shared over the instances by block count. Blocks
        the target holds in any state (a copy there, or one running: its WRITING target)
        are left out, and so are the locations this round marked DELETING (no longer
        SERVING)."""
        cache = group.cache_config
        config = cache.migration_config if cache is not None else None
        routes = [s for s in (config.strategies if config is not None else ()) if _copies(s)]
        copies = self.copies
        if not routes or copies is None:
            return
        try:
            if report.victims:  # what the round marked counts as freed: read the counters again
                usage = self.index.group_usage([group.name])[0]
            live = usage.live().by_type
            contexts = self._contexts(self.directory.members(group.name))
            if not contexts:
                return
            usage_of = dict(
                zip((c.instance_id for c in contexts), self.index.usage([c.layout for c in contexts]), strict=True)
            )
            policy = policy_for(cache.reclaim_strategy if cache is not None else None, self.index.LFU_DECAY_S)
            for route in routes:
                backend = contexts[0].backend(route.source_storage_name)
                if backend is None or contexts[0].backend(route.target_storage_name) is None:
                    continue
                source_type = backend.storage_type.name
                capacity = limits.type_capacity.get(source_type, 0)
                if capacity <= 0 or live.get(source_type, 0) / capacity + TRIGGER_TOLERANCE < route.trigger_threshold:
                    continue
                held = {
                    c.instance_id: usage_of[c.instance_id].by_storage.get(route.source_storage_name, 0)
                    for c in contexts
                }
                shares = sample_shares(TRIGGER_BLOCKS_PER_ROUND, held)
                for ctx in contexts:
                    if not shares.get(ctx.instance_id):
                        continue
                    chosen = coldest_blocks(
                        self.index,
                        ctx,
                        route.source_storage_name,
                        shares[ctx.instance_id],
                        int(now),
                        self.rng,
                        absent_from=route.target_storage_name,
                        policy=policy,
                        config=self.config,
                    )
                    if not chosen:
                        continue
                    keys = [c.block_key for c in chosen]
                    arn = copies.submit(
                        ctx, route.source_storage_name, route.target_storage_name, keys, route.retention
                    )
                    report.copies.append(
                        CopySubmission(
                            ctx.instance_id, route.source_storage_name, route.target_storage_name, len(keys), arn
                        )
                    )
        except Exception as exc:  # noqa: BLE001 - a failing trigger must not stop the other groups
            logger.exception("tier trigger of instance group %s failed", group.name)
            report.error = f"{type(exc).__name__}: {exc}"

    def _sampler(self, ctx: InstanceContext, storage_name: str, plan: Plan) -> BucketSampler:
        """The instance's sampler for ``plan``: a block's location of a type over its quota is
        its candidate, and each candidate knows whether another readable copy covers it."""
        return BucketSampler(
            self.index,
            ctx.layout,
            self.index.storage_table(ctx.layout),
            ctx.spec_layout.sizes,
            self.rng,
            self.config,
            storage_name,
            prefer_types=frozenset(t for t, n in plan.by_type.items() if n > 0),
            coverage=Coverage(frozenset(ctx.servable), spec_group_coverage(ctx), len(ctx.spec_layout.sizes)),
        )

    def _group_lru(
        self,
        group: str,
        contexts: Sequence[InstanceContext],
        live: dict[str, Usage],
        plan: Plan,
        policy: LRUPolicy,
        storage_name: str,
        now: float,
        submit: Submit,
        demotes: dict[str, str],
    ) -> dict[str, InstanceReport]:
        """The group's bytes (total and per type) freed in one recency order across its
        instances (``instance.PooledReclaim``); returns what each instance gave."""
        need = Need(plan.bytes, {t: n for t, n in plan.by_type.items() if n > 0})
        members = [
            Member(ctx, self._sampler(ctx, storage_name, plan), live[ctx.instance_id].keys, demotes=demotes)
            for ctx in contexts
            if live[ctx.instance_id].keys > 0
        ]
        if not need.pending or not members:
            return {}
        work = PooledReclaim(self.index, members, policy, need, self.config, int(now), submit, self.demoter)
        reports = work.run()
        if self.metrics is not None:
            self.metrics.incr("group_lru_plan_count", 1, {"instance_group": group})
            if work.partial:
                self.metrics.incr("group_lru_partial_plan_count", 1, {"instance_group": group})
        return {r.instance_id: r for r in reports if r.victims or r.demoted or r.buckets_read}

    def _hand_over_queued(self) -> int:
        """Hand the victims the write path queued (``QueuedDeleter``) to the deleter,
        after each group's delete delay; returns how many."""
        contexts: dict[str, InstanceContext] = {}

        def layout_of(instance_id: str) -> InstanceLayout | None:
            try:
                contexts[instance_id] = self.contexts(instance_id)
            except InstanceNotFoundError:
                return None  # removed: its purge deletes everything
            return contexts[instance_id].layout

        total = 0
        for instance_id, victims in self.index.take_queued_deletions(layout_of).items():
            ctx = contexts[instance_id]
            try:
                self.deleter.submit(ctx, victims, ctx.delete_delay_ms)
            except Exception as exc:  # noqa: BLE001 - pending: the stranded recovery hands them over later
                logger.warning(
                    "queued deletions not handed over",
                    extra={"instance_id": instance_id, "locations": len(victims), "error": str(exc)},
                )
                continue
            total += len(victims)
        return total

    def _sweep_share(self, contexts: Sequence[InstanceContext], state: _GroupState) -> set[str]:
        """The instances whose TTL sweep advances this look: a rotating share."""
        if not contexts:
            return set()
        count = min(len(contexts), TTL_INSTANCES_PER_LOOK)
        start = state.sweep_position % len(contexts)
        state.sweep_position = start + count
        return {contexts[(start + i) % len(contexts)].instance_id for i in range(count)}

    def _reconcile_one(self, groups: Sequence[InstanceGroup], now: float) -> None:
        """Correct the counters of the first group due for it (at most one per round)."""
        for group in groups:
            state = self._states[group.name]
            if now < state.next_reconcile:
                continue
            state.next_reconcile = now + RECONCILE_S
            # Listed now: an instance registered since the reused listing holds bytes the
            # group counter counts, and a sum without it would "correct" them away.
            layouts = [c.layout for c in self._contexts(self.directory.members(group.name, fresh=True))]
            correction = self.index.reconcile_group(group.name, layouts)
            if correction is not None and correction.fields():
                logger.warning(
                    "instance group usage counters corrected",
                    extra={"instance_group": group.name, "correction": correction.fields()},
                )
            return

    def _contexts(self, instance_ids: Sequence[str]) -> list[InstanceContext]:
        out = []
        for instance_id in instance_ids:
            try:
                out.append(self.contexts(instance_id))
            except InstanceNotFoundError:
                continue  # removed since the listing
        return out


def _copies(strategy: MigrationStrategy) -> bool:
    methods = strategy.method_configs
    return methods is not None and methods.copy_config is not None and methods.copy_config.enabled


def _demotes(group: InstanceGroup) -> dict[str, str]:
    """The group's demote routes: source storage name -> target storage name (one per
    source, control.groups checks)."""
    cache = group.cache_config
    config = cache.migration_config if cache is not None else None
    return {
        s.source_storage_name: s.target_storage_name
        for s in (config.strategies if config is not None else ())
        if s.demote_on_reclaim and _copies(s)
    }


def submitter(
    deleter: Deleter,
    clock: Clock,
    group: str,
    delay_ms: int,
    events: EventLog | None = None,
    metrics: MetricsRegistry | None = None,
    metric: str = "cache_reclaimer.block_submit_count",
) -> Submit:
    """Hands victims just marked to deletion after ``delay_ms``, publishing the upstream
    ``CacheReclaimSubmit`` event and counting them in ``metric``."""

    def submit(ctx: InstanceContext, taken: Sequence[tuple[Victim, Candidate]]) -> None:
        victims = [v for v, _ in taken]
        deleter.submit(ctx, victims, delay_ms)
        if events is not None:
            events.publish(
                ctx.instance_id,
                "CacheReclaimSubmit",
                now_us(clock),
                block_keys=[v.block_key for v in victims],
                location_ids=[[str(v.location_id)] for v in victims],
                delay_us=delay_ms * 1000,
            )
        if metrics is not None:
            metrics.incr(metric, len(victims), {"instance_group": group})

    return submit


# ---------------------------------------------------------------- entry points


def _always() -> bool:
    return True


class LeaseGuard:
    """The background lease during a round: renewed once a third of its ttl has passed."""

    def __init__(self, lease: Lease, clock: Clock) -> None:
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


class ReclaimJob:
    """One process's reclaim duty: rounds under the background lease (app.py's schedule,
    the local scheduler every second), never two at once, and the write path's wake-ups."""

    def __init__(self, reclaimer: Reclaimer, index: BlockIndex, clock: Clock, lease: Lease | None = None) -> None:
        self.reclaimer = reclaimer
        self.index = index
        self.clock = clock
        self.lease = lease
        self._round_lock = threading.Lock()
        self._woken_at: dict[str, float] = {}

    def run(self) -> dict[str, Any]:
        """One reclaim round; returns its report as a dict (``skipped`` says why a round did
        nothing). Runs only while this node holds the lease (when there is one)."""
        if not self._round_lock.acquire(blocking=False):
            return ReclaimReport(skipped="a reclaim round is already running in this process").to_dict()
        try:
            guard = LeaseGuard(self.lease, self.clock) if self.lease is not None else None
            if guard is not None and not guard.acquire():
                return ReclaimReport(skipped="another node holds the background lease").to_dict()
            report = self.reclaimer.run_round(guard.held if guard is not None else _always)
            if report.victims or any(g.error for g in report.groups):
                logger.info(
                    "reclaim round",
                    extra={
                        "victims": report.victims,
                        "bytes": report.bytes,
                        "duration_ms": round(report.duration_ms, 1),
                        "errors": [g.error for g in report.groups if g.error],
                    },
                )
            return report.to_dict()
        finally:
            self._round_lock.release()

    def wake(self, group_name: str) -> None:
        """Wake the reclaimer for ``group_name``: the data plane calls this when a write is
        refused for capacity. The group is looked at in the next round, whatever its
        ``trigger_period_seconds``, with at least one reclaim step of headroom made under each
        hard limit. Cheap (one SADD, at most every ``WAKE_DEBOUNCE_S`` per group and
        process) and never raises."""
        try:
            now = self.clock.now()
            last = self._woken_at.get(group_name)
            if last is not None and 0 <= now - last < WAKE_DEBOUNCE_S:
                return
            self._woken_at[group_name] = now
            self.index.request_reclaim(group_name)
        except Exception:  # noqa: BLE001 - a wake-up is best effort; the periodic check follows anyway
            logger.warning("could not wake the reclaimer for instance group %s", group_name, exc_info=True)
