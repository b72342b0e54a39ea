"""A tiny, obviously correct (and slow) reference of the replay semantics.

Every cached block is a dict entry {tick, freq, parent}; every eviction scans all of them.
Nothing here shares code with chalicelib.optimizer except the record type.
"""

from __future__ import annotations

from chalicelib.optimizer.traces import Op, Query


class RefCache:
    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.blocks: dict[int, dict] = {}
        self.clock = 0

    def touch(self, key: int, parent: int | None) -> bool:
        """Refresh or insert ``key``; True when it was inserted."""
        self.clock += 1
        block = self.blocks.get(key)
        if block is None:
            self.blocks[key] = {"tick": self.clock, "freq": 1, "parent": parent}
            return True
        block["tick"] = self.clock
        block["freq"] += 1
        return False

    def has_cached_child(self, key: int) -> bool:
        return any(b["parent"] == key for b in self.blocks.values())

    def victim(self) -> int:
        keys = list(self.blocks)
        if self.policy == "leaf_aware_lru":
            keys = [k for k in keys if not self.has_cached_child(k)]
        if self.policy == "lfu":
            return min(keys, key=lambda k: (self.blocks[k]["freq"], self.blocks[k]["tick"]))
        return min(keys, key=lambda k: self.blocks[k]["tick"])

    def evict_one(self) -> int:
        key = self.victim()
        del self.blocks[key]
        return key


def masked(mask, i: int) -> bool:
    if isinstance(mask, int):
        return i < mask
    return i < len(mask) and mask[i]


def reference_replay(
    records,
    policy: str,
    capacity: int,
    *,
    mode: str = "instance_precise",
    batch: int = 4,
    block_size: int = 4,
    read_refresh: bool = True,
):
    """Returns (counters dict, {instance: set of cached keys}, [victims per step])."""
    caches: dict[str, RefCache] = {}
    order: list[str] = []
    cursor = 0
    totals = dict(reads=0, read_blocks=0, internal=0, external=0, tokens=0, hit_tokens=0, written=0, inserted=0)
    victims_per_step = []
    for r in records:
        if r.instance not in caches:
            caches[r.instance] = RefCache(policy)
            order.append(r.instance)
        cache = caches[r.instance]
        victims = []
        keys = list(r.keys)
        if r.op in (Op.READ, Op.REQUEST):
            hits = []
            internal = 0
            if r.query == Query.PREFIX_MATCH:
                internal = sum(1 for i in range(len(keys)) if masked(r.mask, i))
                for i, k in enumerate(keys):
                    if masked(r.mask, i):
                        continue
                    if k not in cache.blocks:
                        break
                    hits.append(k)
            elif r.query == Query.BATCH_GET:
                hits = [k for k in keys if k in cache.blocks]
            else:
                sw = r.sw_size
                for start in range(len(keys) - sw, -1, -1):
                    window = keys[start : start + sw]
                    if sw >= 1 and all(k in cache.blocks for k in window):
                        hits = window
                        break
            if r.op == Op.READ and read_refresh:
                for k in reversed(hits):
                    cache.touch(k, None)
            n = len(keys)
            tokens = r.input_tokens or n * block_size
            hit_tokens = min((internal + len(hits)) * block_size, tokens)
            totals["reads"] += 1
            totals["read_blocks"] += n
            totals["internal"] += internal
            totals["external"] += len(hits)
            totals["tokens"] += tokens
            totals["hit_tokens"] += hit_tokens
        if r.op in (Op.WRITE, Op.REQUEST):
            skip = r.mask if r.op == Op.WRITE else 0
            totals["inserted"] += len({k for i, k in enumerate(keys) if not masked(skip, i) and k not in cache.blocks})
            for i in range(len(keys) - 1, -1, -1):
                if masked(skip, i):
                    continue
                totals["written"] += 1
                parent = keys[i - 1] if i and keys[i - 1] != keys[i] else None
                if cache.touch(keys[i], parent):
                    if mode == "instance_precise" and len(cache.blocks) > capacity:
                        victims.append(cache.evict_one())
            if mode == "instance_rough" and len(cache.blocks) > capacity:
                over = len(cache.blocks) - capacity
                for _ in range(min(-(-over // batch) * batch, len(cache.blocks))):
                    victims.append(cache.evict_one())
            if mode == "group_rough":
                while sum(len(c.blocks) for c in caches.values()) > capacity:
                    progressed = False
                    for _ in range(len(order)):
                        c = caches[order[cursor]]
                        cursor = (cursor + 1) % len(order)
                        for _ in range(min(batch, len(c.blocks))):
                            victims.append(c.evict_one())
                            progressed = True
                        if sum(len(x.blocks) for x in caches.values()) <= capacity:
                            break
                    if not progressed:
                        break
        victims_per_step.append(victims)
    state = {name: set(c.blocks) for name, c in caches.items()}
    return totals, state, victims_per_step
