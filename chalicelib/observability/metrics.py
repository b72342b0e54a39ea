"""Metrics: each container records into its registry and publishes the changes to a
shared store (a Valkey hash, ``stores.metrics``), so getMetrics reports the whole
service whichever container answers: counters and means summed over every container,
gauges as last set anywhere.

A container publishes at most once per ``period_s`` on the request path (one round trip
a second at most), and at the end of every scheduled or task function (``runtime.job``).
A change that could not be published is kept and goes with the next publication.

Histograms (the metrics named in ``HISTOGRAMS``) count samples per bucket of fixed bounds,
besides their sum and count, so that Prometheus can compute quantiles (a p99 to alert on)
from any number of containers' buckets added up.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..clock import Clock
from .logging import logger

Tags = tuple[tuple[str, str], ...]
MetricKey = tuple[str, Tags]
#: A histogram bucket: the metric and the bucket's upper bound (``math.inf`` for the last).
BucketKey = tuple[MetricKey, float]
COUNTER, MEAN, GAUGE = "counter", "mean", "gauge"

#: Upper bounds, in µs, of the API calls' latency buckets (``service.call_latency_us``): from
#: a cached read (~0.3 ms) to API Gateway's 29 s limit.
CALL_LATENCY_BOUNDS_US: tuple[float, ...] = (
    250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 29_000_000,
)  # fmt: skip
#: The histogram metrics and their buckets' upper bounds (a last ``+Inf`` bucket is implied).
HISTOGRAMS: dict[str, tuple[float, ...]] = {"service.call_latency_us": CALL_LATENCY_BOUNDS_US}


def bucket_bound(name: str, value: float) -> float:
    """The upper bound of the bucket of histogram ``name`` that counts ``value``."""
    return next((bound for bound in HISTOGRAMS[name] if value <= bound), math.inf)


@dataclass
class MetricPoint:
    name: str
    tags: Tags
    value: float | int
    #: COUNTER (an int that only grows), MEAN (of the observed samples) or GAUGE.
    kind: str = GAUGE


@dataclass
class MetricsDelta:
    """Metric changes: counter increments, sums and counts of samples (means and
    histograms), histogram bucket counts, gauges set."""

    counters: dict[MetricKey, int] = field(default_factory=lambda: defaultdict(int))
    sums: dict[MetricKey, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[MetricKey, int] = field(default_factory=lambda: defaultdict(int))
    #: Samples per histogram bucket (not cumulative).
    buckets: dict[BucketKey, int] = field(default_factory=lambda: defaultdict(int))
    gauges: dict[MetricKey, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.counters or self.counts or self.gauges)

    def merge(self, other: MetricsDelta) -> None:
        """Add ``other``'s changes (``other``'s gauges are older: they yield to ours)."""
        for key, value in other.counters.items():
            self.counters[key] += value
        for key, total in other.sums.items():
            self.sums[key] += total
        for key, value in other.counts.items():
            self.counts[key] += value
        for bucket, value in other.buckets.items():
            self.buckets[bucket] += value
        self.gauges = {**other.gauges, **self.gauges}

    def drop(self, doomed: Callable[[MetricKey], bool]) -> None:
        """Delete the series whose key ``doomed`` says."""
        for values in (self.counters, self.sums, self.counts, self.gauges):
            for key in [key for key in values if doomed(key)]:
                del values[key]
        for bucket in [bucket for bucket in self.buckets if doomed(bucket[0])]:
            del self.buckets[bucket]

    def points(self) -> list[MetricPoint]:
        """The values these totals stand for: counters, means of the samples, gauges."""
        points = [MetricPoint(n, t, v, COUNTER) for (n, t), v in self.counters.items()]
        points += [MetricPoint(n, t, self.sums[(n, t)] / c, MEAN) for (n, t), c in self.counts.items() if c]
        points += [MetricPoint(n, t, v, GAUGE) for (n, t), v in self.gauges.items()]
        return sorted(points, key=lambda p: (p.name, p.tags))


class MetricsRegistry:
    """Counters, means and gauges keyed by (name, tags), with the changes not published
    yet; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = MetricsDelta()
        self._pending = MetricsDelta()

    @staticmethod
    def _key(name: str, tags: dict[str, str] | None) -> MetricKey:
        return name, tuple(sorted((tags or {}).items()))

    def incr(self, name: str, value: int = 1, tags: dict[str, str] | None = None) -> None:
        """Add to a counter."""
        key = self._key(name, tags)
        with self._lock:
            self._totals.counters[key] += value
            self._pending.counters[key] += value

    def observe(self, name: str, value: float, tags: dict[str, str] | None = None) -> None:
        """Record a sample; reported as the mean of the samples."""
        key = self._key(name, tags)
        with self._lock:
            for delta in (self._totals, self._pending):
                delta.sums[key] += value
                delta.counts[key] += 1

    def histogram(self, name: str, value: float, tags: dict[str, str] | None = None) -> None:
        """Record a sample of a histogram of ``HISTOGRAMS``: its bucket, sum and count."""
        key = self._key(name, tags)
        bucket = (key, bucket_bound(name, value))
        with self._lock:
            for delta in (self._totals, self._pending):
                delta.buckets[bucket] += 1
                delta.sums[key] += value
                delta.counts[key] += 1

    def gauge(self, name: str, value: float, tags: dict[str, str] | None = None) -> None:
        """Set a gauge to its current value."""
        key = self._key(name, tags)
        with self._lock:
            self._totals.gauges[key] = value
            self._pending.gauges[key] = value

    def forget(self, tag: str, value: str) -> None:
        """Drop every series tagged ``tag=value``, published or not (see MetricsStore.forget)."""
        with self._lock:
            for delta in (self._totals, self._pending):
                delta.drop(lambda key: (tag, value) in key[1])

    def drain(self) -> MetricsDelta:
        """The changes since the last drain (to publish), forgotten here."""
        with self._lock:
            pending, self._pending = self._pending, MetricsDelta()
        return pending

    def restore(self, delta: MetricsDelta) -> None:
        """Take back drained changes that could not be published."""
        with self._lock:
            self._pending.merge(delta)

    def record_call(self, method: str, code: str, latency_us: int) -> None:
        """The per-call metrics of the API method ``method`` (its lowerCamel HTTP name),
        tagged ``api_name`` with the upstream RPC name (``rpc_name``): upstream's counter and
        mean latency, and the latency histogram."""
        tags = {"api_name": rpc_name(method)}
        self.incr("service.query_counter", 1, tags)
        self.observe("service.query_rt_us", latency_us, tags)
        self.histogram("service.call_latency_us", latency_us, tags)
        if code != "OK":
            self.incr("service.error_counter", 1, {**tags, "code": code})

    def value(self, name: str, tags: dict[str, str] | None = None) -> float | None:
        """One metric's value in this container (None when never recorded); for tests and
        health pages."""
        key = self._key(name, tags)
        with self._lock:
            totals = self._totals
            if key in totals.counters:
                return totals.counters[key]
            if totals.counts.get(key):
                return totals.sums[key] / totals.counts[key]
            return totals.gauges.get(key)


def rpc_name(method: str) -> str:
    """The upstream RPC name of an HTTP method name: ``getCacheLocation`` →
    ``GetCacheLocation``. Upstream's tests and dashboards select ``service.*`` metrics by
    this ``api_name`` tag."""
    return method[:1].upper() + method[1:]


class MetricsPublisher:
    """Hands a registry's changes to a shared store's ``add``, at most once per period
    unless forced. Never raises: metrics must not fail a call or a job."""

    def __init__(
        self, registry: MetricsRegistry, add: Callable[[MetricsDelta], None], clock: Clock, period_s: float = 1.0
    ) -> None:
        self._registry = registry
        self._add = add
        self._clock = clock
        self._period_s = period_s
        self._lock = threading.Lock()
        self._next = float("-inf")

    def publish(self, force: bool = True) -> bool:
        """Publish the pending changes (when due, or always with ``force``); returns
        whether the store has every change made before the call. Unforced, a call while
        another thread publishes returns at once rather than wait."""
        if not self._lock.acquire(blocking=force):
            return False
        try:
            now = self._clock.now()
            if not force and now < self._next:
                return False
            self._next = now + self._period_s
            delta = self._registry.drain()
            if not delta:
                return True
            try:
                self._add(delta)
                return True
            except Exception as exc:  # noqa: BLE001 - kept for the next publication
                self._registry.restore(delta)
                logger.warning("metrics not published: %s", exc)
                return False
        finally:
            self._lock.release()
