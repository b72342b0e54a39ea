"""Freeing a need from one instance, or from several in one recency order: sample, pick,
mark, hand over, climb.

The loop gathers a pool of about ``oversample`` candidates per block still needed, takes
the policy's worst (each victim is the worst of about ``oversample`` sampled blocks, as
in Redis' approximated LRU), marks them DELETING with a compare-and-set on their location
ids, and hands the ones really taken to deletion. Parents of the victims are re-read: a
parent whose children are all gone or marked has become a leaf and joins the pool, so a
stale prefix chain goes in one round from its end to its root.

``PooledReclaim`` runs that loop over one pool fed by several instances (Group-LRU,
UPSTREAM_V2 §2.13): the pool's size is shared out between the instances half evenly,
half by block count, victims are ordered by (last access, instance id, block key) and
marked in runs of consecutive victims of the same instance. With one instance it is the
per-instance loop (``InstanceReclaim``) exactly.

Given a ``Demoter`` (reclaim rounds only, never the write path's eviction), a victim on the
source of a ``demote_on_reclaim`` strategy is copied to the next tier instead of marked,
while only its type's need is left (docs/tiered-storage.md, "Demote instead of delete").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, Any, Protocol

from ..index import BlockIndex, Victim
from ..observability.logging import logger
from .policies import Candidate, VictimPolicy
from .sampling import BucketSampler, SamplingConfig
from .selection import CandidatePool
from .watermark import Need

if TYPE_CHECKING:
    from ..cache.context import InstanceContext

#: Floor of the candidates-per-bucket estimate (an empty start must not divide by zero;
#: the trip size bounds what one read costs anyway).
MIN_DENSITY = 0.01
#: Candidates pooled across a group in one round, at most (upstream's
#: ``group_lru_max_sampling_size``).
GROUP_LRU_MAX_SAMPLE = 65536

#: Receives the victims just marked in an instance, with what each frees.
Submit = Callable[["InstanceContext", Sequence[tuple[Victim, Candidate]]], None]


@dataclass(frozen=True)
class Demotion:
    """What a demote began: the blocks whose copy to the next tier began (their bytes
    count as freed until it ends: ``Usage.demoting_by_type``) and those the target holds
    already in a state no copy can be made over (a copy running there, a DELETING object):
    neither copied nor dropped this time. Any other victim handed over is dropped."""

    demoted: frozenset[int] = frozenset()
    held: frozenset[int] = frozenset()


@dataclass(frozen=True)
class DemoteStart:
    """One execution a round's demotes started in an instance (``execution_arn``), or the
    blocks of one that could not be started (``unstarted``: to drop)."""

    instance_id: str
    execution_arn: str = ""
    unstarted: frozenset[int] = frozenset()


class DemoteRound(Protocol):
    def begin(self, ctx: InstanceContext, source: str, target: str, victims: Sequence[tuple[int, int]]) -> Demotion:
        """Begin copying the (block key, SERVING location id) ``victims`` of ``ctx`` from
        storage ``source`` to ``target`` with DELETE_SOURCE."""

    def start(self) -> list[DemoteStart]:
        """Start the copies begun (at the end of the round)."""


class Demoter(Protocol):
    def round(self) -> DemoteRound:
        """The demotes of one reclaim round (``workflows.demotion``)."""


@dataclass
class InstanceReport:
    """What a round did in one instance."""

    instance_id: str
    victims: int = 0
    expired: int = 0
    bytes: int = 0
    buckets_read: int = 0
    #: Victims demoted instead (their copy to the next tier began) and their bytes: not in
    #: ``victims``/``bytes``, which count what was dropped.
    demoted: int = 0
    demoted_bytes: int = 0
    #: The tier_copy executions copying them.
    demote_executions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add(self, other: InstanceReport) -> InstanceReport:
        """Both parts of a round in the same instance, summed."""
        return InstanceReport(
            self.instance_id,
            self.victims + other.victims,
            self.expired + other.expired,
            self.bytes + other.bytes,
            self.buckets_read + other.buckets_read,
            self.demoted + other.demoted,
            self.demoted_bytes + other.demoted_bytes,
            self.demote_executions + other.demote_executions,
        )


@dataclass
class Member:
    """One instance taking part in a pooled reclaim."""

    ctx: InstanceContext
    sampler: BucketSampler
    #: The instance's block count: how many buckets its first sample needs, and its
    #: weight in the pool's shares.
    blocks_hint: int
    #: Blocks never taken (a write making room keeps the blocks it is about).
    protected: frozenset[int] = frozenset()
    #: Demote routes, source storage name -> target storage name (``demote_on_reclaim``).
    demotes: Mapping[str, str] = field(default_factory=dict)
    admitted: int = 0
    #: Sampling failed: the instance sits the rest of the round out (a partial plan).
    failed: bool = False
    report: InstanceReport = field(init=False)

    def __post_init__(self) -> None:
        self.report = InstanceReport(self.ctx.instance_id)


def sample_shares(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    """``total`` candidates shared among the instances of positive weight: half evenly,
    half in proportion to weight (largest remainder; ties by instance id)."""
    ids = sorted(i for i, w in weights.items() if w > 0)
    if not ids or total <= 0:
        return {}
    even_total = total // 2
    even, extra = divmod(even_total, len(ids))
    shares = {i: even + (n < extra) for n, i in enumerate(ids)}
    rest, weight = total - even_total, sum(weights[i] for i in ids)
    exact = {i: divmod(rest * weights[i], weight) for i in ids}
    left = rest - sum(q for q, _ in exact.values())
    for i in sorted(ids, key=lambda i: (-exact[i][1], i))[:left]:
        shares[i] += 1
    return {i: shares[i] + exact[i][0] for i in ids}


def droppable(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates a drop may take: leaves, and locations another readable copy covers. A
    block admitted with children for a demote that did not take it stays (its drop would cut
    its descendants' prefixes); a later round tries it again."""
    return [c for c in candidates if c.is_leaf or c.covered]


class PooledReclaim:
    """Frees ``need`` (and expired blocks) once, from one candidate pool over ``members``."""

    def __init__(
        self,
        index: BlockIndex,
        members: Sequence[Member],
        policy: VictimPolicy,
        need: Need,
        config: SamplingConfig,
        now_s: int,
        submit: Submit,
        demoter: Demoter | None = None,
    ) -> None:
        self.index = index
        self.demotes = demoter.round() if demoter is not None and any(m.demotes for m in members) else None
        #: The candidates demoted this round, by (instance id, block key).
        self.demoted: dict[tuple[str, int], Candidate] = {}
        self.members = {m.ctx.instance_id: m for m in members}
        self.policy = policy
        self.need = need
        self.config = config
        self.now_s = now_s
        self.submit = submit
        self.pool = CandidatePool()
        self.max_victims = config.max_victims * max(1, len(members))
        self.max_pool = min(config.max_pool * max(1, len(members)), max(config.max_pool, GROUP_LRU_MAX_SAMPLE))
        self.victims = 0

    @property
    def partial(self) -> bool:
        """Whether an instance's sampling failed this round."""
        return any(m.failed for m in self.members.values())

    def run(self, sweep_buckets: int = 0) -> list[InstanceReport]:
        """Sweep ``sweep_buckets`` buckets of each member for expired blocks, then free the need."""
        if sweep_buckets:
            for member in self.members.values():
                self._admit(member, member.sampler.sweep(sweep_buckets))
        block_bytes = min(m.ctx.spec_layout.sizes[0] for m in self.members.values()) if self.members else 1
        while self.victims < self.max_victims:
            if self.need.pending:
                self._fill(self.need.blocks(block_bytes))
            # The worst fifth at a time: parents joining the pool in between compete with
            # the rest, so a stale chain goes before a fresher leaf.
            worst = max(1, len(self.pool) // self.config.oversample)
            limit = min(self.config.mark_batch, self.max_victims - self.victims)
            picked = self.pool.pick(self.policy, self.need, self.now_s, limit, worst)
            if not picked:
                break
            for n, (instance_id, same) in enumerate(groupby(picked, key=lambda c: c.instance_id)):
                run = list(same)
                if n and not self.need.pending and not any(self.policy.expired(c, self.now_s) for c in run):
                    break  # the water level recovered: the rest stays
                self._take(self.members[instance_id], run)
        if self.demotes is not None:
            self._start_demotes(self.demotes)
        for member in self.members.values():
            member.report.buckets_read = member.sampler.buckets_read
        return [m.report for m in self.members.values()]

    def _start_demotes(self, demotes: DemoteRound) -> None:
        """Start the round's demotes; drop the victims of one that could not start (their
        bytes were taken off the need already)."""
        for started in demotes.start():
            member = self.members[started.instance_id]
            if started.execution_arn:
                member.report.demote_executions.append(started.execution_arn)
            unstarted = [c for key in started.unstarted if (c := self.demoted.get((started.instance_id, key)))]
            dropped = droppable(unstarted)
            for c in unstarted:
                member.report.demoted -= 1
                member.report.demoted_bytes -= c.size
            if dropped:
                self._drop(member, dropped, counted=True)

    def _admit(self, member: Member, candidates: list[Candidate]) -> None:
        protected = member.protected
        demotes = member.demotes if self.demotes is not None else {}
        self.pool.add(
            [c for c in candidates if c.block_key not in protected] if protected else candidates,
            # a block with children may be demoted: its copy keeps their prefixes (not dropped)
            (lambda c: c.storage_name in demotes) if demotes else None,
        )

    def _fill(self, blocks: int) -> None:
        wanted = min(self.max_pool, self.config.oversample * max(1, blocks))
        shares = sample_shares(wanted, {i: max(1, m.blocks_hint) for i, m in self.members.items() if not m.failed})
        held = self.pool.count_by_instance()
        for instance_id, share in shares.items():
            member = self.members[instance_id]
            try:
                self._fill_member(member, share, held[instance_id])
            except Exception as exc:  # noqa: BLE001 - the others' candidates still make a plan
                member.failed = True
                logger.warning(
                    "reclaim sampling failed; the round goes on without the instance",
                    extra={"instance_id": instance_id, "error": f"{type(exc).__name__}: {exc}"},
                )

    def _fill_member(self, member: Member, share: int, held: int) -> None:
        sampler = member.sampler
        while held < share and not sampler.exhausted:
            # Read about as many buckets as the pool lacks: the density of candidates per
            # bucket is first guessed from the instance's block count, then measured.
            if sampler.sampled:
                density = member.admitted / sampler.sampled
            else:
                density = member.blocks_hint / max(1, sampler.occupied)
            before = len(self.pool)
            self._admit(member, sampler.sample(math.ceil((share - held) / max(density, MIN_DENSITY))))
            member.admitted += len(self.pool) - before
            held += len(self.pool) - before

    def _take(self, member: Member, picked: list[Candidate]) -> None:
        self.pool.discard(picked)
        if self.demotes is not None and member.demotes:
            picked = droppable(self._demote(self.demotes, member, picked))
        if picked:
            self._drop(member, picked)

    def _drop(self, member: Member, picked: list[Candidate], counted: bool = False) -> None:
        """Mark ``picked`` DELETING and hand them to deletion (``counted``: their bytes were
        taken off the need and the victim bound already, by a demote that did not start)."""
        ctx = member.ctx
        by_key = {c.block_key: c for c in picked}
        # Only locations still SERVING under the same id are taken, of blocks that gained
        # no child: a block rewritten, removed or extended since it was read is left alone.
        victims = self.index.mark_deleting(
            ctx.layout,
            list(by_key),
            ctx.spec_layout.sizes,
            expected_locations=[c.location_id for c in by_key.values()],
            serving_only=True,
            max_children=[c.recorded_children for c in by_key.values()],
            delay_ms=ctx.delete_delay_ms,
        )
        taken = [(v, by_key[v.block_key]) for v in victims]
        if not taken:
            return
        for _, c in taken:
            if not counted:
                self.need.take(c.size, c.storage_type)
            member.report.victims += 1
            member.report.bytes += c.size
            member.report.expired += self.policy.expired(c, self.now_s)
        if not counted:
            self.victims += len(taken)
        self.submit(ctx, taken)
        self._climb(member, [c for _, c in taken])

    def _demote(self, demotes: DemoteRound, member: Member, picked: list[Candidate]) -> list[Candidate]:
        """Hand the victims a demote route takes to its copy; returns the rest, to drop.
        Only a need of the victim's type is met by a demote (the bytes stay in the group
        and the instance, the block stays a key): with group, instance or key need left,
        and for an expired block or a location another copy covers already, they drop."""
        if self.need.bytes or self.need.keys:
            return picked
        rest: list[Candidate] = []
        routed: dict[str, list[Candidate]] = {}
        for c in picked:
            if (
                c.storage_name in member.demotes
                and not c.covered
                and self.need.by_type.get(c.storage_type, 0) > 0
                and not self.policy.expired(c, self.now_s)
            ):
                routed.setdefault(c.storage_name, []).append(c)
            else:
                rest.append(c)
        for source, run in routed.items():
            try:
                done = demotes.begin(
                    member.ctx, source, member.demotes[source], [(c.block_key, c.location_id) for c in run]
                )
            except Exception as exc:  # noqa: BLE001 - the victims are dropped instead, as without a route
                logger.warning(
                    "demote failed; its victims are dropped",
                    extra={"instance_id": member.ctx.instance_id, "error": f"{type(exc).__name__}: {exc}"},
                )
                done = Demotion()
            moved = [c for c in run if c.block_key in done.demoted]
            for c in run:
                if c.block_key in done.demoted:
                    self.demoted[(member.ctx.instance_id, c.block_key)] = c
                    self.need.take(c.size, c.storage_type)
                    member.report.demoted += 1
                    member.report.demoted_bytes += c.size
                elif c.block_key not in done.held:
                    rest.append(c)
            self.victims += len(done.demoted)
            self._climb(member, moved)  # a demoted block's parent may go next in this round
        return rest

    def _climb(self, member: Member, taken: list[Candidate]) -> None:
        """Admit the victims' parents, as they are now: a child marked DELETING no longer
        counts in its parent's child count (the mark unlinks it), so a parent whose
        children are all marked is a leaf."""
        parents = list(dict.fromkeys(c.parent for c in taken if c.parent is not None))
        if not parents:
            return
        raws = member.sampler.reread(parents)
        self._admit(
            member,
            [
                candidate
                for parent, raw in raws.items()
                if raw is not None and (candidate := member.sampler.candidate(parent, raw)) is not None
            ],
        )


class InstanceReclaim:
    """Frees ``need`` (and expired blocks) in one instance, once."""

    def __init__(
        self,
        index: BlockIndex,
        ctx: InstanceContext,
        policy: VictimPolicy,
        need: Need,
        sampler: BucketSampler,
        config: SamplingConfig,
        now_s: int,
        submit: Submit,
        blocks_hint: int,
        protected: frozenset[int] = frozenset(),
        demotes: Mapping[str, str] | None = None,
        demoter: Demoter | None = None,
    ) -> None:
        self.member = Member(ctx, sampler, blocks_hint, protected, demotes or {})
        self.work = PooledReclaim(index, [self.member], policy, need, config, now_s, submit, demoter)

    def run(self, sweep_buckets: int = 0) -> InstanceReport:
        """Sweep ``sweep_buckets`` buckets for expired blocks, then free the need."""
        return self.work.run(sweep_buckets)[0]
