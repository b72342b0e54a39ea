"""What the hit feed costs a read, and what the ``hit_curves`` job costs per entry.

(a) 128-key prefix reads through ``CacheService.get_cache_location`` on 20,000 written
blocks, in turns in one run: the feed off (the baseline), at the default 1/8, and at 1
(every read sampled); beside them the raw redis-py floor: EVALSHA of the read script
alone, and EVALSHA + XADD in one pipeline. (b) ``LiveCurve.feed`` on the entries of a
generated trace (1/8 sample, s_max 8192): entries/s and the saved state's size.

    .venv/bin/python bench/bench_hit_feed.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import valkey_server
from bench.bench_meta import build_runtime, write_blocks

N = 128
BLOCKS = 20_000
ROUNDS, CALLS = 7, 200


def per_call_us(variants: dict, calls: int = CALLS) -> dict[str, float]:
    """Per variant (a setup and a call), the median over ``ROUNDS`` of its mean µs per
    call; the variants take turns in every round (a loaded machine drifts)."""
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, (setup, fn) in variants.items():
            setup()
            started = time.perf_counter()
            for i in range(calls):
                fn(i)
            rounds[name].append((time.perf_counter() - started) / calls * 1e6)
    return {name: statistics.median(values) for name, values in rounds.items()}


def main() -> None:
    from chalicelib.observability.hit_feed import HASH_RANGE, READ, HitFeed, threshold_of
    from chalicelib.optimizer.live import LiveCurve
    from chalicelib.optimizer.tracegen import TraceShape, generate_records
    from chalicelib.protocol.models import GetCacheLocationRequest

    with valkey_server() as client, tempfile.TemporaryDirectory() as data:
        rt, aws = build_runtime(client, data, BLOCKS * 2)
        keys = list(range(1, BLOCKS + 1))
        write_blocks(rt, keys)
        requests = [
            GetCacheLocationRequest(instance_id="bench", block_keys=keys[i : i + N], query_type="QT_PREFIX_MATCH")
            for i in range(0, BLOCKS - N, N)
        ]
        feed = rt.hit_feed

        def read(i: int) -> None:
            rt.cache.get_cache_location(requests[i % len(requests)])

        print(f"(a) {N}-key prefix read, µs per call (median of {ROUNDS} rounds of {CALLS})")

        def rate(threshold: int):
            def setup() -> None:
                feed.threshold = threshold
                client.delete(rt.hit_curve_store.stream("bench"))

            return setup

        figures = per_call_us(
            {
                "feed 1/8": (rate(threshold_of(1 / 8)), read),
                "feed off (baseline)": (rate(0), read),
                "feed 1": (rate(HASH_RANGE), read),
            }
        )
        base = figures["feed off (baseline)"]
        for name, us in figures.items():
            print(f"  CacheService {name:<22} {us:8.1f}  ({us / base:.2f}x)")
        script = rt.index._read
        layout = rt.contexts("bench").layout
        sha = script.sha
        stream = rt.hit_curve_store.stream("bench")
        entry = HitFeed(HASH_RANGE, 100_000).read("bench", b"p", keys[:16])
        assert entry is not None
        fields = entry.fields()

        def evalsha(i: int) -> None:
            client.evalsha(sha, 2, layout.key("m"), layout.key("st"), b"", 0, 0, 0, 0, 0, "")

        def evalsha_xadd(i: int) -> None:
            pipe = client.pipeline(transaction=False)
            pipe.evalsha(sha, 2, layout.key("m"), layout.key("st"), b"", 0, 0, 0, 0, 0, "")
            pipe.xadd(stream, fields, maxlen=100_000, approximate=True)
            pipe.execute()

        raw = per_call_us({"floor": (lambda: None, evalsha), "both": (lambda: None, evalsha_xadd)})
        floor, both = raw["floor"], raw["both"]
        print(f"  raw EVALSHA (empty read)            {floor:8.1f}  (1.00x)")
        print(f"  raw EVALSHA + XADD, one pipeline    {both:8.1f}  ({both / floor:.2f}x)")
        aws.stop()

    shape = TraceShape(distinct_blocks=200_000, seed=1)
    sampling = HitFeed(threshold_of(1 / 8), 0)
    entries = []
    for record in generate_records(shape):
        for e in (sampling.read("i", b"p", record.keys), sampling.write(record.keys)):
            if e is not None:
                entries.append(e)
    curve = LiveCurve(threshold=sampling.threshold, s_max=8192)
    started = time.perf_counter()
    for e in entries:
        curve.feed(e)
    elapsed = time.perf_counter() - started
    reads = sum(e.op == READ for e in entries)
    state = curve.to_bytes()
    print(
        f"(b) LiveCurve.feed: {len(entries):,} entries ({reads:,} reads) of a 200k-block trace in {elapsed:.2f} s: "
        f"{len(entries) / elapsed:,.0f} entries/s; saved state {len(state) / 1024:.0f} KiB, {curve.kept} keys kept"
    )


if __name__ == "__main__":
    main()
