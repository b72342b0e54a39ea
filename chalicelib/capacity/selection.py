"""The candidate pool of one instance's round, and victim choice (pure).

Only leaf blocks enter the pool: a block with live children is never a victim, since its
descendants would no longer match any prefix. A parent becomes a candidate once every
child is gone — or marked in this same round (the sampler re-reads it then) — so a
prefix chain is reclaimed from its end towards its root.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .policies import Candidate, VictimPolicy
from .watermark import Need


class CandidatePool:
    """Reclaimable leaf blocks seen this round, by instance and block key (one instance's,
    or a whole group's for Group-LRU)."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, int], Candidate] = {}

    def __len__(self) -> int:
        return len(self._items)

    def add(self, candidates: Iterable[Candidate]) -> None:
        """Admit the leaves among ``candidates`` (a later sighting replaces an earlier one)."""
        for c in candidates:
            if c.is_leaf or c.demote_only:
                self._items[c.instance_id, c.block_key] = c
            else:
                self._items.pop((c.instance_id, c.block_key), None)

    def discard(self, candidates: Iterable[Candidate]) -> None:
        for c in candidates:
            self._items.pop((c.instance_id, c.block_key), None)

    def count_by_instance(self) -> Counter[str]:
        """How many candidates each instance has in the pool."""
        return Counter(instance_id for instance_id, _ in self._items)

    def pick(self, policy: VictimPolicy, need: Need, now_s: int, limit: int, need_limit: int) -> list[Candidate]:
        """Up to ``limit`` victims: expired candidates first, then — at most ``need_limit``
        of them — the policy's worst among those that still help ``need``. ``need`` is
        not changed: what is really freed is known only once the victims are marked. While
        the group's bytes are over (not only a type), a location another readable copy
        covers goes before any block it would take out of the cache: dropping it keeps every
        hit."""
        ordered = policy.order(self._items.values(), now_s)
        if need.bytes > 0:
            ordered.sort(key=lambda c: not c.covered)  # stable: the policy's order within each part
        picked = [c for c in ordered if policy.expired(c, now_s)][:limit]
        scratch = need.copy()
        for c in picked:
            scratch.take(c.size, c.storage_type)
        chosen = {(c.instance_id, c.block_key) for c in picked}
        by_need = 0
        for c in ordered:
            if len(picked) >= limit or by_need >= need_limit or not scratch.pending:
                break
            if (c.instance_id, c.block_key) in chosen or not scratch.wants(c.storage_type):
                continue
            picked.append(c)
            scratch.take(c.size, c.storage_type)
            by_need += 1
        return picked
