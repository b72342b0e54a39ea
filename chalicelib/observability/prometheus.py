"""Metrics in the Prometheus text exposition format (version 0.0.4), for ``GET /metrics``.

KVCM's names become Prometheus names: prefixed ``kvcm_``, every character outside
``[a-zA-Z0-9_]`` replaced by ``_`` (``service.query_counter`` →
``kvcm_service_query_counter_total``). Counters are ``counter``s, means are ``summary``s
without quantiles (``_sum`` and ``_count``: Prometheus averages over any window from
them), histograms (``metrics.HISTOGRAMS``) are ``histogram``s with a cumulative bucket per
bound, ``+Inf`` last, and gauges are ``gauge``s.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping

from .metrics import HISTOGRAMS, MetricKey, MetricsDelta, Tags

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(name: str, prefix: str = "kvcm") -> str:
    return _INVALID.sub("_", f"{prefix}_{name}")


def _labels(tags: Tags, le: float | None = None) -> str:
    if le is not None:
        tags = (*tags, ("le", "+Inf" if math.isinf(le) else _number(le)))
    if not tags:
        return ""
    return "{" + ",".join(f'{_INVALID.sub("_", key)}="{_escape(value)}"' for key, value in tags) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def _families(values: Mapping[MetricKey, float]) -> dict[str, list[tuple[Tags, float]]]:
    families: dict[str, list[tuple[Tags, float]]] = defaultdict(list)
    for (name, tags), value in sorted(values.items()):
        families[name].append((tags, value))
    return families


def exposition(totals: MetricsDelta, prefix: str = "kvcm") -> str:
    """The text exposition of service-wide totals."""
    lines: list[str] = []

    def family(name: str, kind: str, samples: Iterable[str]) -> None:
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(samples)

    for name, samples in _families(totals.counters).items():
        base = metric_name(name, prefix) + "_total"
        family(base, "counter", (f"{base}{_labels(t)} {_number(v)}" for t, v in samples))
    for name, samples in _families(totals.counts).items():
        base = metric_name(name, prefix)
        family(
            base,
            "histogram" if name in HISTOGRAMS else "summary",
            (
                line
                for t, count in samples
                for line in (
                    *_bucket_lines(base, name, t, totals),
                    f"{base}_sum{_labels(t)} {_number(totals.sums.get((name, t), 0.0))}",
                    f"{base}_count{_labels(t)} {_number(count)}",
                )
            ),
        )
    for name, samples in _families(totals.gauges).items():
        base = metric_name(name, prefix)
        family(base, "gauge", (f"{base}{_labels(t)} {_number(v)}" for t, v in samples))
    return "\n".join(lines) + "\n" if lines else ""


def _bucket_lines(base: str, name: str, tags: Tags, totals: MetricsDelta) -> list[str]:
    """A histogram series' cumulative ``_bucket`` lines, every bound of ``HISTOGRAMS`` then
    ``+Inf`` (empty for a summary)."""
    if name not in HISTOGRAMS:
        return []
    lines, seen = [], 0
    for bound in (*HISTOGRAMS[name], math.inf):
        seen += totals.buckets.get(((name, tags), bound), 0)
        lines.append(f"{base}_bucket{_labels(tags, bound)} {seen}")
    return lines
