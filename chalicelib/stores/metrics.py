"""Service-wide metrics in one Valkey hash: what every container published.

Fields are a kind letter then the JSON ``[name, tags]``: ``c`` counter, ``s`` sum and
``n`` count of a mean's samples, ``g`` gauge. One script call adds a container's changes
atomically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from redis.typing import EncodableT

from ..observability.metrics import MetricKey, MetricsDelta
from .valkey import Valkey, lua_source, valkey_errors

_SCRIPT = lua_source(Path(__file__).with_name("lua"), "metrics_add")


def _field(kind: str, key: MetricKey) -> str:
    name, tags = key
    return kind + json.dumps([name, [list(t) for t in tags]], separators=(",", ":"))


def _key_of(field: str) -> MetricKey:
    name, tags = json.loads(field[1:])
    return name, tuple((k, v) for k, v in tags)


class MetricsStore:
    """Adds containers' metric changes up; reads the service's metrics."""

    def __init__(self, client: Valkey, prefix: str) -> None:
        self.client = client
        self.key = f"{{{prefix}:metrics}}"
        self._add = client.register_script(_SCRIPT)

    def add(self, delta: MetricsDelta) -> None:
        """Add ``delta`` (counters, sums and counts added, gauges set) in one atomic step."""
        args: list[EncodableT] = []
        for kind, op, values in (
            ("c", "i", delta.counters),
            ("s", "f", delta.sums),
            ("n", "i", delta.counts),
            ("g", "s", delta.gauges),
        ):
            for key, value in values.items():
                args += [op, _field(kind, key), repr(float(value)) if op != "i" else int(value)]
        if args:
            with valkey_errors("metrics store"):
                self._add(keys=[self.key], args=args)

    def totals(self) -> MetricsDelta:
        """Every metric of the service as totals: counters, sums and counts, gauges."""
        with valkey_errors("metrics store"):
            raw = cast(dict[bytes, bytes], self.client.hgetall(self.key))
        totals = MetricsDelta()
        parts: dict[str, dict[MetricKey, Any]] = {
            "c": totals.counters,
            "s": totals.sums,
            "n": totals.counts,
            "g": totals.gauges,
        }
        for field, value in raw.items():
            text = field.decode()
            target = parts[text[0]]
            target[_key_of(text)] = int(value) if text[0] in "cn" else float(value)
        return totals
