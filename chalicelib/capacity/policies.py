"""Victim scoring (pure): which reclaimable blocks go first under each reclaim policy.

A policy ranks candidates by ``score`` — lower goes first — and may declare candidates
``expired`` (victims whatever the watermark). Ties fall back to the least recently
accessed block, then the instance id and the block key, so a ranking is deterministic
(across a group's instances too: Group-LRU sorts by last access, instance, key).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from ..protocol.codes import ReclaimPolicy
from ..protocol.models import CacheReclaimStrategy


@dataclass(frozen=True)
class Candidate:
    """A block that may be reclaimed: its SERVING location and what the policies score."""

    block_key: int
    location_id: int
    parent: int | None
    #: Live children (blocks whose prefix parent this is), as far as this round knows.
    children: int
    last_access_s: int
    lfu: int
    size: int
    storage_type: str
    #: The child count its record held when read, marked children not dropped yet
    #: included: the block is taken only if the record holds no more by then.
    recorded_children: int = 0
    #: The instance holding it: block keys repeat across instances (the same prompt
    #: prefix cached twice), so a pool spanning a group keys candidates by both.
    instance_id: str = ""
    #: Another SERVING copy on a storage that may serve now holds its specs: reclaiming
    #: this location loses no hit (group-bytes pressure takes these first).
    covered: bool = False
    #: The storage of its location (a demote route starts from a storage).
    storage_name: str = ""

    @property
    def is_leaf(self) -> bool:
        return self.children == 0


class VictimPolicy(ABC):
    """Base class of the reclaim policies."""

    name: ClassVar[str]
    #: Whether the policy expires blocks (then rounds also sweep for expired blocks).
    expires: bool = False

    @abstractmethod
    def score(self, candidate: Candidate, now_s: int) -> float:
        """Lower is reclaimed first."""

    def expired(self, candidate: Candidate, now_s: int) -> bool:
        """Whether the candidate goes whatever the watermark (only TTL expires blocks)."""
        return False

    def order(self, candidates: Iterable[Candidate], now_s: int) -> list[Candidate]:
        """``candidates``, first to reclaim first."""
        return sorted(candidates, key=lambda c: (self.score(c, now_s), c.last_access_s, c.instance_id, c.block_key))


class LRUPolicy(VictimPolicy):
    """Least recently accessed first (a served read refreshes a block's access time)."""

    name = "lru"

    def score(self, candidate: Candidate, now_s: int) -> float:
        return candidate.last_access_s


class LFUPolicy(VictimPolicy):
    """Lowest access counter first, the counter decayed by one per ``decay_s`` without
    access — the same decay a read applies (index/reads.py ``Recency``) before counting a new access."""

    name = "lfu"

    def __init__(self, decay_s: int) -> None:
        self.decay_s = decay_s

    def score(self, candidate: Candidate, now_s: int) -> float:
        if self.decay_s <= 0:
            return candidate.lfu
        return max(0, candidate.lfu - max(0, now_s - candidate.last_access_s) // self.decay_s)


class TTLPolicy(VictimPolicy):
    """Nearest expiry first (expiry = last access + ``ttl_s``); blocks idle for longer
    than ``ttl_s`` are expired. ``ttl_s`` 0: nothing expires, ranking as LRU."""

    name = "ttl"

    def __init__(self, ttl_s: int) -> None:
        self.ttl_s = ttl_s
        self.expires = ttl_s > 0

    def score(self, candidate: Candidate, now_s: int) -> float:
        return candidate.last_access_s + self.ttl_s

    def expired(self, candidate: Candidate, now_s: int) -> bool:
        return self.expires and now_s - candidate.last_access_s > self.ttl_s


def policy_for(strategy: CacheReclaimStrategy | None, lfu_decay_s: int) -> VictimPolicy:
    """The policy a group's reclaim strategy names (unspecified: LRU, the default)."""
    if strategy is None:
        return LRUPolicy()
    if strategy.reclaim_policy == ReclaimPolicy.POLICY_LFU:
        return LFUPolicy(lfu_decay_s)
    if strategy.reclaim_policy == ReclaimPolicy.POLICY_TTL:
        return TTLPolicy(strategy.ttl_seconds)
    return LRUPolicy()
