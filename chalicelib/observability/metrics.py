"""In-process metrics, exposed by getMetrics and (on Lambda) flushed as CloudWatch EMF.

Each container keeps its own counters; on AWS the EMF lines are what CloudWatch sums
across containers.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional

Tags = tuple[tuple[str, str], ...]
COUNTER, MEAN, GAUGE = "counter", "mean", "gauge"


@dataclass
class MetricPoint:
    name: str
    tags: Tags
    value: float | int
    #: COUNTER (an int that only grows), MEAN (of the observed samples) or GAUGE.
    kind: str = GAUGE


class MetricsRegistry:
    """Counters and gauges keyed by (name, tags); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, Tags], int] = defaultdict(int)
        self._sums: dict[tuple[str, Tags], float] = defaultdict(float)
        self._counts: dict[tuple[str, Tags], int] = defaultdict(int)
        self._gauges: dict[tuple[str, Tags], float] = {}

    @staticmethod
    def _key(name: str, tags: Optional[dict[str, str]]) -> tuple[str, Tags]:
        return name, tuple(sorted((tags or {}).items()))

    def incr(self, name: str, value: int = 1, tags: Optional[dict[str, str]] = None) -> None:
        """Add to a counter."""
        key = self._key(name, tags)
        with self._lock:
            self._counters[key] += value

    def observe(self, name: str, value: float, tags: Optional[dict[str, str]] = None) -> None:
        """Record a sample; reported as the mean of the samples."""
        key = self._key(name, tags)
        with self._lock:
            self._sums[key] += value
            self._counts[key] += 1

    def gauge(self, name: str, value: float, tags: Optional[dict[str, str]] = None) -> None:
        """Set a gauge to its current value."""
        key = self._key(name, tags)
        with self._lock:
            self._gauges[key] = value

    def record_call(self, api_name: str, code: str, latency_us: int) -> None:
        """The per-call metrics of every API method (upstream names)."""
        tags = {"api_name": api_name}
        self.incr("service.query_counter", 1, tags)
        self.observe("service.query_rt_us", latency_us, tags)
        if code != "OK":
            self.incr("service.error_counter", 1, {"api_name": api_name, "code": code})

    def snapshot(self) -> list[MetricPoint]:
        """Every metric's current value."""
        with self._lock:
            points = [MetricPoint(n, t, v, COUNTER) for (n, t), v in self._counters.items()]
            points += [MetricPoint(n, t, self._sums[(n, t)] / c, MEAN) for (n, t), c in self._counts.items() if c]
            points += [MetricPoint(n, t, v, GAUGE) for (n, t), v in self._gauges.items()]
        return sorted(points, key=lambda p: (p.name, p.tags))

    def value(self, name: str, tags: Optional[dict[str, str]] = None) -> Optional[float]:
        """One metric's value (None when never recorded); for tests and health pages."""
        key = self._key(name, tags)
        with self._lock:
            if key in self._counters:
                return self._counters[key]
            if self._counts.get(key):
                return self._sums[key] / self._counts[key]
            return self._gauges.get(key)

    def emf_lines(self, namespace: str = "KVCM") -> Iterable[dict]:
        """CloudWatch Embedded Metric Format documents for the current values."""
        for point in self.snapshot():
            dims = dict(point.tags)
            yield {
                "_aws": {"CloudWatchMetrics": [{"Namespace": namespace, "Dimensions": [sorted(dims)],
                                                 "Metrics": [{"Name": point.name}]}]},
                point.name: point.value,
                **dims,
            }
