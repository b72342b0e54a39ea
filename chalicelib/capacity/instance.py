"""One instance's share of a reclaim round: sample, pick, mark, hand over, climb.

The loop gathers a pool of about ``oversample`` candidates per block still needed, takes
the policy's worst (each victim is the worst of about ``oversample`` sampled blocks, as
in Redis' approximated LRU), marks them DELETING with a compare-and-set on their location
ids, and hands the ones really taken to deletion. Parents of the victims are re-read: a
parent whose children are all gone or marked has become a leaf and joins the pool, so a
stale prefix chain goes in one round from its end to its root.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from ..index import BlockIndex, Victim
from .policies import Candidate, VictimPolicy
from .sampling import BucketSampler, SamplingConfig
from .selection import CandidatePool
from .watermark import Need

if TYPE_CHECKING:
    from ..cache.context import InstanceContext

#: Floor of the candidates-per-bucket estimate (an empty start must not divide by zero;
#: the trip size bounds what one read costs anyway).
MIN_DENSITY = 0.01

#: Receives the victims just marked in an instance, with what each frees.
Submit = Callable[["InstanceContext", Sequence[tuple[Victim, Candidate]]], None]


@dataclass
class InstanceReport:
    """What a round did in one instance."""

    instance_id: str
    victims: int = 0
    expired: int = 0
    bytes: int = 0
    buckets_read: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class InstanceReclaim:
    """Frees ``need`` (and expired blocks) in one instance, once."""

    def __init__(self, index: BlockIndex, ctx: "InstanceContext", policy: VictimPolicy, need: Need,
                 sampler: BucketSampler, config: SamplingConfig, now_s: int, submit: Submit,
                 blocks_hint: int, protected: frozenset[int] = frozenset()) -> None:
        self.index = index
        self.ctx = ctx
        self.policy = policy
        self.need = need
        self.sampler = sampler
        self.config = config
        self.now_s = now_s
        self.submit = submit
        #: The instance's block count: how many buckets the first sample needs.
        self.blocks_hint = blocks_hint
        #: Blocks never taken (a write making room keeps the blocks it is about).
        self.protected = protected
        self.pool = CandidatePool()
        self._admitted = 0
        self.report = InstanceReport(ctx.instance_id)

    def run(self, sweep_buckets: int = 0) -> InstanceReport:
        """Sweep ``sweep_buckets`` buckets for expired blocks, then free the need."""
        if sweep_buckets:
            self._admit(self.sampler.sweep(sweep_buckets))
        block_bytes = self.ctx.spec_layout.sizes[0]
        while self.report.victims < self.config.max_victims:
            if self.need.pending:
                self._fill(self.need.blocks(block_bytes))
            # The worst fifth at a time: parents joining the pool in between compete with
            # the rest, so a stale chain goes before a fresher leaf.
            worst = max(1, len(self.pool) // self.config.oversample)
            limit = min(self.config.mark_batch, self.config.max_victims - self.report.victims)
            picked = self.pool.pick(self.policy, self.need, self.now_s, limit, worst)
            if not picked:
                break
            self._take(picked)
        self.report.buckets_read = self.sampler.buckets_read
        return self.report

    def _admit(self, candidates: list[Candidate]) -> None:
        self.pool.add([c for c in candidates if c.block_key not in self.protected] if self.protected else candidates)

    def _fill(self, blocks: int) -> None:
        wanted = min(self.config.max_pool, self.config.oversample * max(1, blocks))
        while len(self.pool) < wanted and not self.sampler.exhausted:
            # Read about as many buckets as the pool lacks: the density of candidates per
            # bucket is first guessed from the instance's block count, then measured.
            if self.sampler.sampled:
                density = self._admitted / self.sampler.sampled
            else:
                density = self.blocks_hint / max(1, self.sampler.occupied)
            before = len(self.pool)
            self._admit(self.sampler.sample(math.ceil((wanted - before) / max(density, MIN_DENSITY))))
            self._admitted += len(self.pool) - before

    def _take(self, picked: list[Candidate]) -> None:
        self.pool.discard(c.block_key for c in picked)
        by_key = {c.block_key: c for c in picked}
        # Only locations still SERVING under the same id are taken, of blocks that gained
        # no child: a block rewritten, removed or extended since it was read is left alone.
        victims = self.index.mark_deleting(
            self.ctx.layout, list(by_key), self.ctx.spec_layout.sizes, expected_locations=[c.location_id for c in by_key.values()],
            serving_only=True, max_children=[c.recorded_children for c in by_key.values()])
        taken = [(v, by_key[v.block_key]) for v in victims]
        if not taken:
            return
        for _, c in taken:
            self.need.take(c.size, c.storage_type)
            self.report.victims += 1
            self.report.bytes += c.size
            self.report.expired += self.policy.expired(c, self.now_s)
        self.submit(self.ctx, taken)
        self._climb([c for _, c in taken])

    def _climb(self, taken: list[Candidate]) -> None:
        """Admit the victims' parents, as they are now: a child marked DELETING no longer
        counts in its parent's child count (the mark unlinks it), so a parent whose
        children are all marked is a leaf."""
        parents = list(dict.fromkeys(c.parent for c in taken if c.parent is not None))
        if not parents:
            return
        raws = self.sampler.reread(parents)
        self._admit([candidate for parent in parents if raws[parent] is not None
                     and (candidate := self.sampler.candidate(parent, raws[parent])) is not None])
