"""Exact one-pass hit-ratio curve of prefix-aware LRU, for every capacity at once.

Model (the same as :func:`replay.replay` with ``policy="lru"``, ``instance_precise`` and
``read_refresh=False``; for request-level traces -- Mooncake, Qwen-Bailian -- reads never
need refreshing, since each read is followed by a write touching the same keys, so the
curve equals the default replay too):

* a write touches its keys last block first; an instance's LRU cache of capacity ``C``
  then holds exactly the ``C`` most recently touched distinct keys of that instance;
* a read of key ``k`` therefore finds it cached iff its *stack distance* ``d(k)`` -- the
  number of distinct keys touched since ``k`` was, ``k`` included -- is ``<= C``;
* a prefix-match read hits its first ``i + 1`` unmasked keys iff the running maximum
  ``m_i = max(d_0..d_i)`` is ``<= C``. So one histogram of ``m_i`` gives the hits at every
  capacity: ``hits(C) = #{m_i <= C}``. (With prefix-chained keys ``d`` already increases
  along a request and ``m_i = d_i``; the running maximum keeps the curve exact otherwise.)

Stack distances come from touch *positions*: every touch gets the next integer position,
and ``d = (P - a) - dead(a, P)`` for a key last touched at ``a`` when the clock is at ``P``,
where ``dead`` counts positions in between whose key was touched again later. Dead
positions are bits of per-64-position ints, with counts per chunk and per 64 chunks.

A request's keys were mostly last touched together by one earlier write, so their old
positions form runs ``a, a-1, a-2, ...``; inside a run the distances are consecutive
integers, so each run costs one dead-count query, one bit-mask update and two histogram
updates -- not one per key. The whole curve costs about one replay.

A sampled curve (:mod:`chalicelib.optimizer.shards`: fixed-size SHARDS behind an exact top
of the stack, ``s_max`` or ``sample_rate``) is a :class:`HitRatioCurve` too, with histogram
bins at ``edges``; :func:`shards_error` measures it against the exact curve.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from operator import itemgetter
from typing import Any, TypeVar, cast

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.perf import gc_paused
from chalicelib.optimizer.replay import Totals
from chalicelib.optimizer.traces import Op, Query, Record

_READ, _WRITE, _REQUEST, _PREFIX = Op.READ, Op.WRITE, Op.REQUEST, Query.PREFIX_MATCH
#: Capacities up to saturation at which a sample's error is measured (``mrc --check``).
SHARDS_GRID_POINTS = 40
#: Hit counts: whole blocks for exact curves, scaled-up estimates for sampled ones.
N = TypeVar("N", int, float)


class _Stack:
    """One instance's LRU stack, as touch positions.

    Dead positions are bits of one Python int per 64 positions, with a dead count per
    64-position chunk and per 64-chunk group: the dead positions after ``pos`` are one
    ``bit_count`` plus two C-level ``sum`` calls over at most 64 entries each -- and most
    queries are for recent positions, where the group sum is empty.
    """

    __slots__ = ("last", "bits", "counts", "groups", "clock")

    def __init__(self) -> None:
        self.last: dict[int, int] = {}  # key -> position of its last touch
        self.bits = [0] * 1024  # per chunk of 64 positions: bit set = position dead
        self.counts = [0] * 1024  # dead positions per chunk
        self.groups = [0] * 16  # dead positions per 64 chunks
        self.clock = 0  # the next position

    def distance(self, pos: int) -> int:
        """Stack distance of the key last touched at ``pos``: the alive positions from
        ``pos`` to the clock, ``pos`` included."""
        chunk = pos >> 6
        group = chunk >> 6
        now = self.clock >> 6  # no position past the clock's chunk is dead yet
        dead = (
            (self.bits[chunk] >> ((pos & 63) + 1)).bit_count()
            + sum(self.counts[chunk + 1 : min((group + 1) << 6, now + 1)])
            + sum(self.groups[group + 1 : (now >> 6) + 1])
        )
        return self.clock - pos - dead

    def kill(self, runs: Iterable[tuple[int, int, int]]) -> None:
        """Mark the positions of ``(length, highest position, _)`` runs dead: their keys are
        being touched again."""
        bits, counts, groups = self.bits, self.counts, self.groups
        for length, hi, _ in runs:
            lo = hi - length + 1
            chunk = hi >> 6
            if lo >> 6 == chunk:  # the usual case: the run sits in one chunk
                bits[chunk] |= ((1 << length) - 1) << (lo & 63)
                counts[chunk] += length
                groups[chunk >> 6] += length
                continue
            for chunk in range(lo >> 6, (hi >> 6) + 1):
                first = max(lo, chunk << 6)
                size = min(hi, (chunk << 6) | 63) - first + 1
                bits[chunk] |= ((1 << size) - 1) << (first & 63)
                counts[chunk] += size
                groups[chunk >> 6] += size

    def compact(self, keep: int) -> None:
        """Forget all but the ``keep`` most recently touched keys (renumbered from 0): what
        is left is still the exact top of the stack, every distance up to ``keep``."""
        recent = sorted(self.last.items(), key=itemgetter(1))[-keep:]
        self.last = {key: new for new, (key, _) in enumerate(recent)}
        self.clock = len(recent)
        chunks = max(1024, 2 * ((self.clock >> 6) + 1))
        self.bits, self.counts = [0] * chunks, [0] * chunks
        self.groups = [0] * ((chunks >> 6) + 1)

    def advance(self, count: int) -> None:
        """Reserve ``count`` new positions, growing the arrays as needed."""
        self.clock += count
        chunks = (self.clock >> 6) + 1
        if chunks > len(self.bits):
            grow = max(chunks, len(self.bits))
            self.bits.extend([0] * grow)
            self.counts.extend([0] * grow)
            self.groups.extend([0] * ((len(self.bits) >> 6) + 1 - len(self.groups)))


def _cumulative(diff: list[int], top: int) -> list[int]:
    """From a histogram's difference array whose weights all sit at indices ``<= top``:
    ``c[x]`` = total weight at indices ``<= x``, for ``x <= top``."""
    return list(accumulate(accumulate(diff[: top + 1])))


def is_masked(mask: int | tuple[bool, ...], index: int) -> bool:
    """Whether key ``index`` of a record is masked (an int masks the indices below it)."""
    return index < mask if isinstance(mask, int) else index < len(mask) and mask[index]


def window_threshold(dists: Sequence[int | None], size: int) -> list[int]:
    """Reverse-roll sliding-window match: ``size`` hits once the capacity reaches the
    smallest, over windows of ``size`` keys, of the largest distance in the window."""
    if size < 1 or size > len(dists):
        return []
    best: int | None = None
    for start in range(len(dists) - size + 1):
        window = dists[start : start + size]
        if None in window:
            continue
        worst = max(cast("Sequence[int]", window))
        best = worst if best is None else min(best, worst)
    return [] if best is None else [best] * size


@dataclass
class HitRatioCurve:
    """Hits of prefix-aware LRU at every capacity (blocks per instance)."""

    block_size: int
    sample_rate: float
    reads: int
    read_blocks: int
    internal_hit_blocks: int
    input_tokens: int
    written_blocks: int
    distinct_written: int  # written keys counted once per write
    internal_hit_tokens: int  # capacity-independent part of the token hits
    # cumulative external hit blocks by capacity (exact), or estimated by bin of 1/rate
    # blocks (sampled)
    _hits: list[int] | list[float] = field(repr=False)
    _writes: list[int] = field(repr=False)  # pre-write distances of written keys (diff array)
    _loss: list[int] = field(repr=False)  # tokens hits count past input_tokens (diff array)
    _top: int = field(repr=False)  # the largest stack distance any histogram holds
    elapsed_s: float = 0.0
    #: sampled curves: the capacity of each histogram bin (None: exact, one bin per block)
    edges: list[int] | None = field(default=None, repr=False)
    kept_keys: int = 0  # sampled curves: keys in the sample at the end
    s_max: int | None = None  # sampled curves: the sample's bound (None: a fixed rate)

    @classmethod
    def of_sampled_reads(
        cls,
        *,
        block_size: int,
        sample_rate: float,
        reads: int,
        read_blocks: int,
        hits: list[float],
        edges: list[int],
        kept_keys: int,
        s_max: int | None,
        internal_hit_blocks: int = 0,
        input_tokens: int = 0,
        elapsed_s: float = 0.0,
    ) -> HitRatioCurve:
        """A sampled curve of reads alone (cumulative ``hits`` per bin of ``edges``): no
        write or token-loss histograms (the SHARDS estimates: ``shards``, ``live``)."""
        return cls(
            block_size=block_size,
            sample_rate=sample_rate,
            reads=reads,
            read_blocks=read_blocks,
            internal_hit_blocks=internal_hit_blocks,
            input_tokens=input_tokens,
            written_blocks=0,
            distinct_written=0,
            internal_hit_tokens=0,
            _hits=hits,
            _writes=[0],
            _loss=[0],
            _top=0,
            elapsed_s=elapsed_s,
            edges=edges,
            kept_keys=kept_keys,
            s_max=s_max,
        )

    @cached_property
    def _write_hits(self) -> list[int]:
        """Cumulative written keys that were already cached, by capacity."""
        return _cumulative(self._writes, self._top)

    @cached_property
    def _token_loss(self) -> list[int]:
        """Cumulative token loss by capacity (only :meth:`totals` needs it: built lazily)."""
        return _cumulative(self._loss, self._top)

    @staticmethod
    def _at(cumulative: Sequence[N], index: int) -> N:
        if index < 0:
            return 0
        return cumulative[min(index, len(cumulative) - 1)]

    def _index(self, capacity: int) -> int:
        if capacity < 0:
            raise ConfigError(f"capacity must be >= 0, got {capacity}")
        return capacity if self.edges is None else bisect.bisect_right(self.edges, capacity) - 1

    def _capacity(self, index: int) -> int:
        """The smallest capacity whose hits include histogram bin ``index``."""
        return index if self.edges is None else self.edges[min(index, len(self.edges) - 1)]

    @property
    def exact(self) -> bool:
        """Whether the curve is the exact one (not a SHARDS estimate, even at rate 1)."""
        return self.edges is None

    @property
    def saturation_capacity(self) -> int:
        """The smallest capacity beyond which the hit ratio no longer grows."""
        top = self._hits[-1]
        index = bisect.bisect_left(self._hits, top)
        return self._capacity(index)

    def external_hits(self, capacity: int) -> float:
        """External hit blocks at ``capacity`` (an estimate, scaled up, when sampled)."""
        return self._at(self._hits, self._index(capacity))

    def block_hit_ratio(self, capacity: int) -> float | None:
        """(internal + external hit blocks) / read blocks at ``capacity``."""
        if not self.read_blocks:
            return None
        hits = self.internal_hit_blocks + self._at(self._hits, self._index(capacity))
        return hits / self.read_blocks

    def token_hit_ratio(self, capacity: int) -> float | None:
        """Hit tokens / input tokens; ``None`` for a sampled curve (tokens are not sampled)."""
        if not self.exact or not self.input_tokens:
            return None
        return self.totals(capacity).token_hit_ratio

    def totals(self, capacity: int) -> Totals:
        """The totals a replay at ``capacity`` reports (exact curves only)."""
        if not self.exact:
            raise ConfigError("totals need the exact curve, not a SHARDS estimate")
        external = int(self._at(self._hits, capacity))  # exact: whole blocks
        external_tokens = external * self.block_size - self._at(self._token_loss, capacity)
        return Totals(
            reads=self.reads,
            read_blocks=self.read_blocks,
            internal_hit_blocks=self.internal_hit_blocks,
            external_hit_blocks=external,
            input_tokens=self.input_tokens,
            hit_tokens=self.internal_hit_tokens + external_tokens,
            external_hit_tokens=external_tokens,
            written_blocks=self.written_blocks,
            inserted_blocks=self.distinct_written - self._at(self._write_hits, capacity),
        )

    def at(self, capacities: Iterable[int]) -> dict[int, float | None]:
        """Block hit ratio at each capacity."""
        return {c: self.block_hit_ratio(c) for c in capacities}

    def smallest_capacity(self, target: float) -> int | None:
        """The smallest capacity whose block hit ratio reaches ``target`` (None: never)."""
        if not self.read_blocks:
            return None
        needed = target * self.read_blocks - self.internal_hit_blocks
        if needed <= 0:
            return 0
        # float tolerance: a ratio printed as the target must count as reaching it
        index = bisect.bisect_left(self._hits, needed - 1e-9 * self.read_blocks)
        if index >= len(self._hits):
            return None
        return self._capacity(index)

    def to_dict(self, capacities: Iterable[int]) -> dict[str, Any]:
        """JSON-able curve sampled at ``capacities``."""
        caps = sorted(set(capacities))
        return {
            "policy": "lru",
            "exact": self.exact,
            "sample_rate": self.sample_rate,
            **({} if self.exact else {"s_max": self.s_max, "kept_keys": self.kept_keys}),
            "capacities": caps,
            "block_hit_ratio": [self.block_hit_ratio(c) for c in caps],
            "token_hit_ratio": [self.token_hit_ratio(c) for c in caps],
            "saturation_capacity": self.saturation_capacity,
            "elapsed_s": self.elapsed_s,
        }


class CurveBuilder:
    """Feed records with :meth:`add`, then :meth:`curve`.

    Histograms are difference arrays indexed by stack distance (range adds are O(1)); they
    are kept longer than the largest possible distance, the clock of the busiest stack.
    """

    def __init__(self, *, block_size: int) -> None:
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._stacks: dict[str, _Stack] = {}
        self._reads = [0] * 1024  # m_i of read keys: an external hit at capacities >= m_i
        self._writes = [0] * 1024  # pre-write distances of written keys: no insertion then
        self._loss = [0] * 1024  # tokens that hit blocks would count past input_tokens
        self._top = 0  # the largest distance written into any histogram
        self.reads = self.read_blocks = self.internal = self.input_tokens = 0
        self.internal_tokens = self.written_blocks = self.distinct_written = 0

    def add(self, record: Record) -> None:
        """Account one record."""
        instance, _, op, keys, mask, input_tokens, query, sw_size = record
        stack = self.stack(instance)
        need = stack.clock + 2  # distances of this record are <= the clock before it
        if need > len(self._reads):
            grow = max(need, len(self._reads))  # at least double
            for diff in (self._reads, self._writes, self._loss):
                diff.extend([0] * grow)
        olds = list(map(stack.last.get, keys))
        n = len(keys)
        if op is _REQUEST and not mask and query is _PREFIX:
            untouched = olds.count(None)
            end = olds.index(None) if untouched else n
            if untouched == n - end and len(set(keys)) == n:
                # the usual request: its read and its write share one pass over the runs
                tokens = input_tokens or n * self.block_size
                self.reads += 1
                self.read_blocks += n
                self.input_tokens += tokens
                self.written_blocks += n
                self._pass(stack, keys, olds, end, True, True, 0, tokens)
                return
        if op is not _WRITE:
            self._read(stack, keys, olds, mask, input_tokens, query, sw_size)
        if op is not _READ:
            if op is _WRITE and mask:
                keys = [k for i, k in enumerate(keys) if not is_masked(mask, i)]
                olds = list(map(stack.last.get, keys))
            self._write(stack, keys, olds)

    def stack(self, instance: str) -> _Stack:
        """The LRU stack of ``instance`` (created empty)."""
        stack = self._stacks.get(instance)
        if stack is None:
            stack = self._stacks[instance] = _Stack()
        return stack

    def _read(
        self,
        stack: _Stack,
        keys: Sequence[int],
        olds: list[int | None],
        mask: int | tuple[bool, ...],
        input_tokens: int,
        query: Query,
        sw_size: int,
    ) -> None:
        """A read that does not share its pass with a write (masks, any query)."""
        n = len(keys)
        bs = self.block_size
        tokens = input_tokens or n * bs
        internal = 0
        if mask and query is _PREFIX:
            flags = [is_masked(mask, i) for i in range(n)]
            internal = sum(flags)
            olds = [a for a, masked in zip(olds, flags, strict=True) if not masked]
        self.reads += 1
        self.read_blocks += n
        self.internal += internal
        self.input_tokens += tokens
        self.internal_tokens += min(internal * bs, tokens)
        if query is _PREFIX:
            end = olds.index(None) if None in olds else len(olds)
            self._pass(stack, (), olds, end, True, False, internal, tokens)
        else:
            self._read_keywise(stack, olds, query, sw_size, tokens)

    def _pass(
        self,
        stack: _Stack,
        keys: Sequence[int],
        olds: list[int | None],
        end: int,
        read: bool,
        write: bool,
        internal: int,
        tokens: int,
    ) -> None:
        """One prefix read of ``olds[:end]`` and/or the write of distinct ``keys`` (their
        old positions ``olds``; with both, every touched key lies before ``end``).

        ``olds`` splits into runs of consecutive descending positions, whose distances go
        up by one per key. The read histograms the running maximum of the distances; the
        write histograms the distances, kills the old positions and touches the keys.
        """
        # the hottest loop of the curve: _Stack.distance is inlined
        clock, bits, counts, groups = stack.clock, stack.bits, stack.counts, stack.groups
        now = clock >> 6  # no position past the clock's chunk is dead yet
        now_group = now >> 6
        reads, writes = self._reads, self._writes
        runs: list[tuple[int, int, int]] = []
        running = 0
        top = self._top
        i = 0
        while i < end:
            hi = olds[i]
            if hi is None:
                i += 1
                continue
            j = i + 1
            expect = hi - 1
            while j < end and olds[j] == expect:
                j += 1
                expect -= 1
            length = j - i
            chunk = hi >> 6
            group = chunk >> 6
            d0 = (
                clock
                - hi
                - (
                    (bits[chunk] >> ((hi & 63) + 1)).bit_count()
                    + sum(counts[chunk + 1 : min((group + 1) << 6, now + 1)])
                    + sum(groups[group + 1 : now_group + 1])
                )
            )
            d1 = d0 + length - 1
            if d1 > top:
                top = d1
            if read:
                if running < d0:  # the whole run raises the running maximum
                    reads[d0] += 1
                    reads[d1 + 1] -= 1
                    running = d1
                elif running >= d1:  # the whole run sits under it
                    reads[running] += length
                    reads[running + 1] -= length
                else:
                    reads[running] += running - d0 + 1
                    reads[running + 1] -= running - d0
                    reads[d1 + 1] -= 1
                    running = d1
            if write:
                writes[d0] += 1
                writes[d1 + 1] -= 1
            runs.append((length, hi, d0))
            i = j
        self._top = top
        if read and runs and tokens // self.block_size - internal < end:
            self._lose_tokens(runs, end, running, internal, tokens)
        if write:
            n = len(keys)
            self.distinct_written += n
            if runs:
                stack.kill(runs)
            if (clock + n) >> 6 < len(bits):  # room for the new positions: no regrowth
                stack.clock = clock + n
            else:
                stack.advance(n)
            stack.last.update(zip(keys, range(clock + n - 1, clock - 1, -1), strict=True))

    def _lose_tokens(
        self, runs: list[tuple[int, int, int]], end: int, running: int, internal: int, tokens: int
    ) -> None:
        """Token loss of a prefix read: from the hit count ``cut`` on, ``bs * (internal +
        hits)`` exceeds the request's ``tokens``; record the excess at the running maximum
        where each such hit count is reached."""
        cut = tokens // self.block_size - internal + 1
        if cut > end:
            return
        if cut == end:
            thresholds = [running]
        else:  # rare: expand every running maximum
            thresholds = list(accumulate((d0 + k for length, _, d0 in runs for k in range(length)), max))[
                max(cut, 1) - 1 :
            ]
        self._lose(thresholds, max(cut, 1), internal, tokens)

    def _lose(self, thresholds: list[int], first: int, internal: int, tokens: int) -> None:
        """Record the token excess of hit counts ``first, first + 1, ...``, reached at
        ``thresholds``."""
        bs, loss = self.block_size, self._loss
        for j, d in enumerate(thresholds, first):
            lost = bs * (internal + j) - tokens - max(0, bs * (internal + j - 1) - tokens)
            loss[d] += lost
            loss[d + 1] -= lost

    def _read_keywise(self, stack: _Stack, olds: list[int | None], query: Query, sw_size: int, tokens: int) -> None:
        """Batch-get and sliding-window reads (the mask does not apply): every key on its
        own, by its stack distance."""
        dists = [None if a is None else stack.distance(a) for a in olds]
        if query is Query.BATCH_GET:
            thresholds = sorted(d for d in dists if d is not None)
        else:
            thresholds = window_threshold(dists, sw_size)
        hist = self._reads
        for d in thresholds:
            hist[d] += 1
            hist[d + 1] -= 1
        self._top = max(self._top, *thresholds) if thresholds else self._top
        first = max(tokens // self.block_size + 1, 1)
        self._lose(thresholds[first - 1 :], first, 0, tokens)

    def _write(self, stack: _Stack, keys: Sequence[int], olds: list[int | None]) -> None:
        """A write on its own (or after a read that could not share its pass)."""
        self.written_blocks += len(keys)
        if len(set(keys)) != len(keys):
            # touching a key twice leaves the same LRU order as touching it once, at its
            # last touch (its first index: writes go last block first)
            keys = list(dict.fromkeys(keys))
            olds = list(map(stack.last.get, keys))
        self._pass(stack, keys, olds, len(keys), False, True, 0, 0)

    def curve(self, elapsed_s: float = 0.0) -> HitRatioCurve:
        """The curve of everything added so far."""
        return HitRatioCurve(
            block_size=self.block_size,
            sample_rate=1.0,
            reads=self.reads,
            read_blocks=self.read_blocks,
            internal_hit_blocks=self.internal,
            input_tokens=self.input_tokens,
            written_blocks=self.written_blocks,
            distinct_written=self.distinct_written,
            internal_hit_tokens=self.internal_tokens,
            _hits=_cumulative(self._reads, self._top),
            _writes=self._writes,
            _loss=self._loss,
            _top=self._top,
            elapsed_s=elapsed_s,
        )


def lru_curve(
    records: Iterable[Record], *, block_size: int, sample_rate: float = 1.0, s_max: int | None = None
) -> HitRatioCurve:
    """One pass over ``records``: the prefix-aware LRU hit ratio at every capacity -- exact,
    or a SHARDS estimate: fixed-size with ``s_max`` (at most that many sampled keys, the
    rate starting at ``sample_rate``), at a fixed rate with ``sample_rate < 1`` alone."""
    # imported here: shards builds on this module's curve
    from chalicelib.optimizer.shards import SampledCurveBuilder

    if not 0 < sample_rate <= 1:
        raise ConfigError(f"sample_rate must be in (0, 1], got {sample_rate}")
    started = time.perf_counter()
    builder: CurveBuilder | SampledCurveBuilder = (
        CurveBuilder(block_size=block_size)
        if sample_rate == 1 and s_max is None
        else SampledCurveBuilder(block_size=block_size, sample_rate=sample_rate, s_max=s_max)
    )
    add = builder.add
    with gc_paused():
        for record in records:
            add(record)
        curve = builder.curve()
    curve.elapsed_s = time.perf_counter() - started
    return curve


def shards_error(exact: HitRatioCurve, sampled: HitRatioCurve, capacities: Iterable[int]) -> dict[str, float]:
    """Mean and max absolute block-hit-ratio error of a sampled curve at ``capacities``, the
    capacity of the max and the signed error there (negative: the estimate is low)."""
    errors = {c: (sampled.block_hit_ratio(c) or 0.0) - (exact.block_hit_ratio(c) or 0.0) for c in capacities}
    if not errors:
        raise ConfigError("shards_error needs at least one capacity")
    worst = max(errors, key=lambda c: abs(errors[c]))
    return {
        "mean_abs_error": sum(map(abs, errors.values())) / len(errors),
        "max_abs_error": abs(errors[worst]),
        "max_at_capacity": worst,
        "error_at_max": errors[worst],
    }
