"""Fixed-size SHARDS: the prefix-aware LRU curve in memory bounded by ``s_max``.

**Two parts, one pass.** Every instance keeps

* the **exact top** of its LRU stack: the ``s_max`` .. ``2 s_max`` most recently touched
  keys, every key included (the exact curve's stack, :class:`mrc._Stack`, compacted to its
  ``s_max`` most recent keys when it holds twice that). A key in it has its exact stack
  distance, so every hit at a distance up to the top's size is counted exactly, whatever
  the sample draws -- the hot blocks of prefix caches (roots, system prompts: a few
  blocks, a large share of all reads, touched by nearly every request) are all there;
* a **fixed-size SHARDS sample** (Waldspurger et al., FAST '15) for the distances past
  the top: the keys whose hash is under a threshold ``T`` (rate ``R = T / 2**32``). ``T``
  starts at the whole range (or at ``sample_rate``); when an arriving key would make the
  sample exceed ``s_max`` keys (over all instances), the kept key with the largest hash
  leaves and ``T`` drops to that hash, so the sample is always *every* key hashing under
  ``T``: uniform at rate ``R``. ``s_max`` None keeps a fixed rate (memory grows with the
  trace). A kept key's distance is ``1 + (c - 1) / R`` for ``c`` kept keys touched since
  its last touch, itself included (it is one block for itself, every other kept key
  stands for ``1 / R``); a key leaving the sample leaves its stack, so ``c`` counts the
  current sample and dividing by the current ``R`` stays right after ``T`` drops.

**The prefix rule under sampling.** A prefix read hits block ``i`` iff every block
``0..i`` of its own request is cached: iff the running maximum ``max(d_0..d_i)`` is at most
the capacity. Each sampled block must be decided by *its own request's* prefix, including
the unsampled blocks before it, which the sample cannot see. Two facts make that work:

* the top decides the request up to its first key ``e`` out of the top, exactly (running
  maximum of exact distances); from ``e`` on every ``m_i`` exceeds the top's size, since
  the top is exactly the most recent distinct keys. If the top was never compacted, a key
  out of it was never written: the request's hits end at ``e``, as in the exact curve;
* past ``e``, writes touch keys last block first, so with prefix-chained ids (a block id
  fixes its whole prefix: Mooncake, Qwen-Bailian, KVCM's block keys) every write of block
  ``i`` also writes ``0..i-1`` after it: ``d_0 <= ... <= d_i``, the running maximum *is*
  ``d_i``, and the estimates keep that order exactly (the kept keys touched since ``j < i``
  are a subset of those touched since ``i``). So a kept block past ``e`` hits at the
  running maximum of the kept estimates (at least the top's size + 1), and the first kept
  block never cached ends the request's hits, as a miss ends a real prefix match. What
  the sample cannot see is a hit prefix broken past ``e`` by an unkept block alone (a
  write with holes, an id reused under another parent): those reads count as hits.

**Hit counts.** A kept block's far hit counts ``1 / R`` blocks, ``R`` at the time of the
read (each read of a key is in the sample with probability ``R``). The number of far reads
(read keys from ``e`` on) is known exactly, so the far hits are corrected by it:
``ratio`` (the default) scales them by exact / sampled far reads; ``adj`` is SHARDS_adj,
the difference added to the first far bucket (the paper's correction for hot keys with
short distances; here the top already counts those exactly, what is left is ordinary
sampling noise, and scaling it measured better: docs/optimizer.md). Reads, read blocks and
internal hits are counted exactly, from every record.

Histogram bins are exact capacities up to ``2 s_max + 2`` blocks, then grow by 1/1,024 (a
capacity is rounded down by at most 0.1 %). Memory: ``2 s_max`` keys per instance in the
tops, ``s_max`` in the sample, and the bins.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from typing import Literal

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.mrc import CurveBuilder, HitRatioCurve, _cumulative, _Stack, is_masked, window_threshold
from chalicelib.optimizer.traces import Op, Query, Record

_SALT = 0x5BD1E995  # hash((key, salt)) mixes even small sequential ids (xxHash-based
# tuple hash); int hashing is not randomized per process, so samples are reproducible
_HASH_BITS = 32
_RANGE = 1 << _HASH_BITS
_MASK = _RANGE - 1
_EXACT_BINS = 1024  # capacities below this are bins of their own
_READ, _WRITE, _PREFIX = Op.READ, Op.WRITE, Query.PREFIX_MATCH
#: The default sample size of ``mrc``: 0.01 max error on generated traces of 10 k to 10 M
#: distinct blocks (docs/optimizer.md); a few MB of state.
DEFAULT_S_MAX = 65_536
#: How the sample's far hits are corrected by the exact count of far reads: ``ratio``
#: scales them by it, ``adj`` (SHARDS_adj) adds the difference to the first far bucket.
Correction = Literal["ratio", "adj"]
CORRECTIONS: tuple[Correction, ...] = ("ratio", "adj")


def capacity_edges(top: float, *, exact: int) -> list[int]:
    """Histogram bin capacities ``0, 1, ..., exact - 1``, then each 1/1024 above the last,
    until one reaches ``top``."""
    edges = list(range(max(exact, _EXACT_BINS)))
    while edges[-1] < top:
        edges.append(edges[-1] + max(1, edges[-1] // _EXACT_BINS))
    return edges


class _SampleStack(_Stack):
    """One instance's LRU stack of sampled keys: the exact curve's stack (touch positions,
    dead bits), renumbered when dead positions outgrow the live ones (memory stays
    ``O(kept keys)``)."""

    __slots__ = ("members",)

    def __init__(self) -> None:
        super().__init__()
        self.members: set[int] = set()  # the instance's keys in the sample (written or not)

    def count_since(self, key: int) -> int | None:
        """Sampled keys touched since ``key`` was, ``key`` included (None: not cached)."""
        pos = self.last.get(key)
        return None if pos is None else self.distance(pos)

    def write(self, keys: Sequence[int]) -> None:
        """Touch distinct ``keys`` last first (``keys[0]`` ends on top)."""
        last = self.last
        self.kill([(1, pos, 0) for pos in map(last.get, keys) if pos is not None])
        clock, n = self.clock, len(keys)
        self.advance(n)
        last.update(zip(keys, range(clock + n - 1, clock - 1, -1), strict=True))
        if self.clock > 2 * len(last) + 4096:
            self.compact(len(last))

    def remove(self, key: int) -> None:
        """``key`` left the sample."""
        self.members.discard(key)
        pos = self.last.pop(key, None)
        if pos is not None:
            self.kill([(1, pos, 0)])


class SampledCurveBuilder:
    """Feed records with :meth:`add`, then :meth:`curve` (an estimate; see the module doc).

    ``s_max``: the exact top of each stack holds ``s_max`` .. ``2 s_max`` keys and the sample
    at most ``s_max`` (fixed-size SHARDS, the rate starting at ``sample_rate``); ``s_max``
    None: a fixed ``sample_rate``, the top at :data:`DEFAULT_S_MAX`, the sample unbounded.
    """

    def __init__(
        self,
        *,
        block_size: int,
        s_max: int | None = DEFAULT_S_MAX,
        sample_rate: float = 1.0,
        seed: int = 0,
        correction: Correction = "ratio",
    ) -> None:
        if s_max is not None and s_max < 1:
            raise ConfigError(f"s_max must be >= 1, got {s_max}")
        if not 0 < sample_rate <= 1:
            raise ConfigError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if correction not in CORRECTIONS:
            raise ConfigError(f"correction must be one of {', '.join(CORRECTIONS)}, got {correction!r}")
        self.correction = correction
        self._top = CurveBuilder(block_size=block_size)  # exact, each stack compacted
        self._top_keep = s_max or DEFAULT_S_MAX
        self.block_size = block_size
        self.s_max = s_max
        self._salt = _SALT + seed  # another seed draws another sample
        self._threshold = max(1, int(sample_rate * _RANGE))  # kept: hash < threshold
        self._heap: list[tuple[int, int, str]] = []  # (-hash, key, instance) of kept keys
        self._stacks: dict[str, _SampleStack] = {}
        self._compacted: set[str] = set()  # instances whose exact top dropped keys
        self._edges = capacity_edges(_EXACT_BINS, exact=2 * self._top_keep + 2)
        self._hits: list[float] = [0.0] * len(self._edges)  # estimated far hit blocks, by bin
        self.far_reads = 0  # read keys past the exact top (exact count)
        self.sampled_far_reads = 0.0  # the sample's estimate of far_reads

    @property
    def sample_rate(self) -> float:
        """The rate the hash applies now."""
        return self._threshold / _RANGE

    @property
    def kept(self) -> int:
        """Keys in the sample (at most ``s_max``)."""
        return len(self._heap)

    def _keep(self, instance: str, stack: _SampleStack, key: int, hashed: int) -> None:
        """Admit a new key to the sample; when that overfills it, the largest hash leaves
        and the threshold drops to it (every key at that hash leaves too)."""
        heap = self._heap
        heapq.heappush(heap, (-hashed, key, instance))
        stack.members.add(key)
        if self.s_max is None or len(heap) <= self.s_max:
            return
        self._threshold = -heap[0][0]
        while heap and -heap[0][0] >= self._threshold:
            _, evicted, owner = heapq.heappop(heap)
            self._stacks[owner].remove(evicted)

    def _kept_keys(self, instance: str, stack: _SampleStack, keys: Sequence[int]) -> list[int]:
        """The keys of ``keys`` in the sample (admitting new ones), in order."""
        salt, threshold, members = self._salt, self._threshold, stack.members
        # every kept key hashes under the threshold: one pass finds them and the new ones
        kept = [k for k in keys if hash((k, salt)) & _MASK < threshold]
        for key in kept:
            if key not in members:
                hashed = hash((key, salt)) & _MASK
                if hashed < self._threshold:
                    self._keep(instance, stack, key, hashed)
        if threshold == self._threshold:
            return kept
        return [k for k in kept if k in members]  # the threshold dropped: some left

    def _hit(self, distance: float, weight: float) -> None:
        edges = self._edges
        if distance > edges[-1]:
            grown = capacity_edges(distance * 2, exact=2 * self._top_keep + 2)
            self._hits.extend([0.0] * (len(grown) - len(edges)))
            self._edges = edges = grown
        self._hits[bisect.bisect_left(edges, distance)] += weight

    def add(self, record: Record) -> None:
        """Account one record."""
        instance, _, op, keys, mask, _, query, sw_size = record
        stack = self._stacks.get(instance)
        if stack is None:
            stack = self._stacks[instance] = _SampleStack()
        top = self._top.stack(instance)
        if len(top.last) > 2 * self._top_keep:
            top.compact(self._top_keep)
            self._compacted.add(instance)
        kept = self._kept_keys(instance, stack, keys)
        if op is not _WRITE and instance in self._compacted:
            # (a top never compacted holds every key written: a key out of it is not cached)
            self._read_far(stack, top.last, keys, kept, mask, query, sw_size)
        self._top.add(record)  # reads of the top exactly; writes of every key
        if op is not _READ:
            if op is _WRITE and mask:
                written = {k for i, k in enumerate(keys) if not is_masked(mask, i)}
                kept = [k for k in kept if k in written]
            # last block first; a key written twice ends where its first index puts it
            stack.write(list(dict.fromkeys(kept)))

    def _read_far(
        self,
        stack: _SampleStack,
        top: dict[int, int],
        keys: Sequence[int],
        kept: list[int],
        mask: int | tuple[bool, ...],
        query: Query,
        sw_size: int,
    ) -> None:
        """The part of a read past the exact top of the stack, from the sample."""
        prefix = query is _PREFIX
        unmasked = [k for i, k in enumerate(keys) if not is_masked(mask, i)] if prefix and mask else keys
        beyond = len(top) + 1  # every key out of the top is at least this far
        if prefix:
            # the top decides the request's prefix up to its first key out of the top; from
            # there on every distance is > beyond, and the sampled keys decide
            olds = list(map(top.get, unmasked))
            if None not in olds:
                return
            far = unmasked[olds.index(None) :]
        else:
            far = [k for k in unmasked if k not in top]
        if not far:
            return
        far_set = set(far)
        far_kept = [k for k in kept if k in far_set]
        weight = _RANGE / self._threshold  # blocks each kept read stands for
        self.far_reads += len(far)
        self.sampled_far_reads += weight * len(far_kept)
        scale = _RANGE / self._threshold
        distances: list[float | None] = []
        for key in far_kept:
            count = stack.count_since(key)
            distances.append(None if count is None else max(beyond, 1 + (count - 1) * scale))
        if prefix:
            running = float(beyond)
            for distance in distances:
                if distance is None:  # never cached: the request's hits end here
                    break
                running = max(running, distance)
                self._hit(running, weight)
        elif query is Query.BATCH_GET:
            for distance in distances:
                if distance is not None:
                    self._hit(distance, weight)
        else:
            # the window is sw_size blocks of the full key list: its share of kept keys
            size = max(1, round(sw_size * len(far_kept) / len(keys)))
            for d in window_threshold([None if d is None else round(d) for d in distances], size):
                self._hit(d, weight)

    def curve(self, elapsed_s: float = 0.0) -> HitRatioCurve:
        """The estimated curve of everything added so far: the exact top, plus the sample's
        far hits corrected by ``self.correction`` (see the module doc)."""
        top = self._top
        exact = _cumulative(top._reads, top._top)  # cumulative exact hits by capacity
        hits = list(self._hits)
        first = bisect.bisect_left(self._edges, self._top_keep + 1)  # the first far bucket
        if self.correction == "adj":
            hits[first] += self.far_reads - self.sampled_far_reads
        elif self.sampled_far_reads:
            ratio = self.far_reads / self.sampled_far_reads
            hits = [h * ratio for h in hits]
        cumulative: list[float] = []
        far = 0.0
        for capacity, value in zip(self._edges, hits, strict=True):
            far += value  # a negative SHARDS_adj bucket clamps at 0 until hits outweigh it
            cumulative.append(exact[min(capacity, len(exact) - 1)] + min(max(far, 0.0), float(self.far_reads)))
        return HitRatioCurve.of_sampled_reads(
            block_size=self.block_size,
            sample_rate=self.sample_rate,
            reads=top.reads,
            read_blocks=top.read_blocks,
            hits=cumulative,
            edges=self._edges,
            kept_keys=self.kept,
            s_max=self.s_max,
            internal_hit_blocks=top.internal,
            input_tokens=top.input_tokens,
            elapsed_s=elapsed_s,
        )
