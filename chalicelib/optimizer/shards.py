"""SHARDS: the prefix-aware LRU curve from a spatial sample of the keys, stratified.

Plain SHARDS keeps the keys whose hash falls under the rate ``R`` and lets every kept key
stand for ``1/R`` keys. Prefix caches defeat it: the first block of a request (a system
prompt's block, or the conversation's root) is shared by many requests -- on the shared
Mooncake trace one root block is 4.2 % of every block read and nearly always a hit. Such
a block is sampled whole or not at all, and its hash decides the curve: unsampled (its
hash is 0.63 of the range), every sampled curve was ~4 points low at every rate; sampled
at 0.01, it would weigh 100x and the curve would be ~25 points high.

So the sample is stratified by the prefix structure:

* **roots** -- the first key of every read or write (a key seen there once stays a root)
  -- are always kept, each standing for itself (weight 1 block). They are few: one per
  distinct first block, which prefix sharing keeps small;
* **other keys** are kept when their hash is under the rate, each standing for ``1/R``
  blocks.

A kept key's stack distance is the weight of the distinct kept keys touched since its last
touch, itself included (a Fenwick tree of weights over touch positions, compacted when
dead positions pile up). Root hits are counted as they are; hits of the other keys are
scaled by the stratum's exact read count over its sampled read count (a ratio estimator:
the sample's luck in how many reads it caught cancels). Reads, read blocks and internal
hits are counted exactly from the unsampled records.

Distances are integers in units of ``1 / 2**24`` of a sampled key's weight, so a root
weighs exactly ``threshold`` units and no float rounding moves a key across a bin.
Histogram bins are ``1 / (16 R)`` blocks wide (at least one block): a kept key stands for
``1/R`` blocks, but a root's distance can be a single block.
"""

from __future__ import annotations

from collections.abc import Sequence

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.mrc import HitRatioCurve, is_masked, window_threshold
from chalicelib.optimizer.traces import Op, Query, Record

_SALT = 0x5BD1E995  # hash((key, salt)) mixes even small sequential ids (xxHash-based
# tuple hash); int hashing is not randomized per process, so samples are reproducible
_SCALE = 1 << 24  # hash range, and the weight of a non-root sampled key in distance units
_BINS_PER_KEY = 16  # histogram bins per sampled key's weight (1/R blocks)
_READ, _WRITE, _PREFIX = Op.READ, Op.WRITE, Query.PREFIX_MATCH


class _WeightedStack:
    """One instance's LRU stack of sampled keys, with weights (Fenwick tree by position)."""

    __slots__ = ("last", "weights", "tree", "clock", "total")

    def __init__(self) -> None:
        self.last: dict[int, int] = {}  # key -> position of its last touch
        self.weights = [0] * 1024  # weight at each position (0: dead or not yet used)
        self.tree = [0] * 1025  # Fenwick tree over weights, 1-based
        self.clock = 0
        self.total = 0

    def _add(self, pos: int, weight: int) -> None:
        tree = self.tree
        i = pos + 1
        while i < len(tree):
            tree[i] += weight
            i += i & -i

    def distance(self, key: int, own: int) -> int | None:
        """Weight of the keys touched since ``key`` was, plus ``own`` for ``key`` itself
        (None: not cached)."""
        pos = self.last.get(key)
        if pos is None:
            return None
        tree = self.tree
        upto = 0  # weight of positions <= pos
        i = pos + 1
        while i > 0:
            upto += tree[i]
            i -= i & -i
        return self.total - upto + own

    def touch(self, key: int, weight: int) -> None:
        """Move ``key`` to the top of the stack."""
        old = self.last.get(key)
        if old is not None:
            self._add(old, -self.weights[old])
            self.total -= self.weights[old]
            self.weights[old] = 0
        if self.clock == len(self.weights):
            self._make_room()
        pos = self.clock
        self.clock += 1
        self.weights[pos] = weight
        self._add(pos, weight)
        self.total += weight
        self.last[key] = pos

    def _make_room(self) -> None:
        """Renumber the live positions from 0 (in order) into an array twice their count."""
        alive = sorted(self.last.items(), key=lambda item: item[1])
        size = max(1024, 2 * len(alive))
        weights = [0] * size
        for new, (key, old) in enumerate(alive):
            weights[new] = self.weights[old]
            self.last[key] = new
        tree = [0, *weights]
        for i in range(1, size + 1):  # O(n) Fenwick build
            parent = i + (i & -i)
            if parent <= size:
                tree[parent] += tree[i]
        self.weights, self.tree, self.clock = weights, tree, len(alive)


class SampledCurveBuilder:
    """Feed records with :meth:`add`, then :meth:`curve` (an estimate; see the module doc)."""

    def __init__(self, *, block_size: int, sample_rate: float, seed: int = 0) -> None:
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        if not 0 < sample_rate < 1:
            raise ConfigError(f"sample_rate must be in (0, 1), got {sample_rate}")
        self.block_size = block_size
        self._salt = _SALT + seed  # another seed draws another sample
        self._threshold = max(1, int(sample_rate * _SCALE))
        self.sample_rate = self._threshold / _SCALE  # the rate the hash really applies
        # bin = ceil(blocks * bins per block) = ceil(units * _bins / (threshold * _SCALE))
        self._bins = min(_SCALE, _BINS_PER_KEY * self._threshold)
        self._bin_units = self._threshold * _SCALE
        self._stacks: dict[str, _WeightedStack] = {}
        self._roots: set[int] = set()
        self._root_hits: list[int] = []  # histograms of hit distances, by bin
        self._other_hits: list[int] = []
        self.reads = self.read_blocks = self.internal = self.input_tokens = 0
        self.other_reads = self.other_sampled_reads = 0  # non-root external read keys

    def _weight(self, key: int) -> int:
        """A kept key's weight in distance units; 0 when it is not in the sample."""
        if key in self._roots:
            return self._threshold  # one block
        return _SCALE if hash((key, self._salt)) & (_SCALE - 1) < self._threshold else 0

    def _hit(self, distance: int, key: int) -> None:
        bin_ = -(-distance * self._bins // self._bin_units)
        hist = self._root_hits if key in self._roots else self._other_hits
        if bin_ >= len(hist):
            hist.extend([0] * (bin_ + 1 - len(hist)))
        hist[bin_] += 1

    def add(self, record: Record) -> None:
        """Account one record."""
        instance, _, op, keys, mask, input_tokens, query, sw_size = record
        stack = self._stacks.get(instance)
        if stack is None:
            stack = self._stacks[instance] = _WeightedStack()
        if keys:
            self._roots.add(keys[0])  # before weighing: a root stays whole from the start
        if op is not _WRITE:
            self._read(stack, keys, mask, input_tokens, query, sw_size)
        if op is not _READ:
            written = [k for i, k in enumerate(keys) if not (op is _WRITE and is_masked(mask, i))]
            # last block first; a key written twice ends where its first index puts it
            for key in reversed(list(dict.fromkeys(written))):
                weight = self._weight(key)
                if weight:
                    stack.touch(key, weight)

    def _read(
        self,
        stack: _WeightedStack,
        keys: Sequence[int],
        mask: int | tuple[bool, ...],
        input_tokens: int,
        query: Query,
        sw_size: int,
    ) -> None:
        n = len(keys)
        prefix = query is _PREFIX
        unmasked = [(i, k) for i, k in enumerate(keys) if not (prefix and is_masked(mask, i))]
        self.reads += 1
        self.read_blocks += n
        self.internal += n - len(unmasked)
        self.input_tokens += input_tokens or n * self.block_size
        roots = self._roots
        self.other_reads += sum(1 for _, k in unmasked if k not in roots)
        kept = [k for _, k in unmasked if self._weight(k)]
        self.other_sampled_reads += sum(1 for k in kept if k not in roots)
        # a kept key stands for 1/R keys when others count its distance, but for itself
        # it is one block: E[distance] is then the true distance, not 1/R - 1 blocks more
        distances = [stack.distance(k, self._threshold) for k in kept]
        if prefix:
            # prefix-chained keys: a kept key that is not cached ends the hit prefix (its
            # unsampled neighbours share its fate); the running maximum keeps the order
            running = 0
            for key, distance in zip(kept, distances, strict=True):
                if distance is None:
                    break
                running = max(running, distance)
                self._hit(running, key)
        elif query is Query.BATCH_GET:
            for key, distance in zip(kept, distances, strict=True):
                if distance is not None:
                    self._hit(distance, key)
        else:
            # the window is sw_size blocks of the full key list: its share of kept keys
            size = max(1, round(sw_size * len(kept) / n)) if n else 0
            threshold = window_threshold(distances, size)
            if threshold:
                start = len(kept) - size
                for key in kept[start:]:
                    self._hit(threshold[0], key)

    def curve(self, elapsed_s: float = 0.0) -> HitRatioCurve:
        """The estimated curve of everything added so far."""
        scale = self.other_reads / self.other_sampled_reads if self.other_sampled_reads else 1 / self.sample_rate
        size = max(len(self._root_hits), len(self._other_hits))
        roots = self._root_hits + [0] * (size - len(self._root_hits))
        others = self._other_hits + [0] * (size - len(self._other_hits))
        hits: list[float] = []
        total = 0.0
        for root, other in zip(roots, others, strict=True):
            total += root + other * scale
            hits.append(total)
        return HitRatioCurve(
            block_size=self.block_size,
            sample_rate=self.sample_rate,
            reads=self.reads,
            read_blocks=self.read_blocks,
            internal_hit_blocks=self.internal,
            input_tokens=self.input_tokens,
            written_blocks=0,
            distinct_written=0,
            internal_hit_tokens=0,
            _hits=hits or [0.0],
            _writes=[0],
            _loss=[0],
            _top=0,
            elapsed_s=elapsed_s,
            bins_per_block=self._bins / _SCALE,
        )
