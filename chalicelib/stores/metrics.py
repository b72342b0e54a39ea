"""Service-wide metrics in one Valkey hash: what every container published.

Fields are a kind letter then the JSON ``[name, tags]``: ``c`` counter, ``s`` sum and
``n`` count of a mean's or a histogram's samples, ``g`` gauge, and ``b`` a histogram bucket's
count with its upper bound: ``[name, tags, bound]`` (``"+Inf"`` for the last). One script
call adds a container's changes atomically; one forgets every series of a removed instance.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import cast

from redis.typing import EncodableT

from ..observability.metrics import BucketKey, MetricKey, MetricsDelta
from ..valkey import Valkey, lua_source, valkey_errors

_LUA = Path(__file__).with_name("lua")
_SCRIPT = lua_source(_LUA, "metrics_add")
_FORGET = lua_source(_LUA, "metrics_forget")
_COMPACT = (",", ":")


def _field(kind: str, key: MetricKey) -> str:
    name, tags = key
    return kind + json.dumps([name, [list(t) for t in tags]], separators=_COMPACT)


def _bucket_field(bucket: BucketKey) -> str:
    (name, tags), bound = bucket
    label = "+Inf" if math.isinf(bound) else repr(float(bound))
    return "b" + json.dumps([name, [list(t) for t in tags], label], separators=_COMPACT)


def _key_of(field: str) -> MetricKey:
    name, tags = json.loads(field[1:])[:2]
    return name, tuple((k, v) for k, v in tags)


def _bucket_of(field: str) -> BucketKey:
    return _key_of(field), float(json.loads(field[1:])[2].replace("+Inf", "inf"))


def tag_pattern(key: str, value: str) -> str:
    """The text every field of a series tagged ``key=value`` contains (tags are sorted
    pairs in the field's JSON, so the pair stands whole)."""
    return json.dumps([key, value], separators=_COMPACT)


class MetricsStore:
    """Adds containers' metric changes up; reads the service's metrics."""

    def __init__(self, client: Valkey, prefix: str) -> None:
        self.client = client
        self.key = f"{{{prefix}:metrics}}"
        self._add = client.register_script(_SCRIPT)
        self._forget = client.register_script(_FORGET)

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
        for bucket, count in delta.buckets.items():
            args += ["i", _bucket_field(bucket), int(count)]
        if args:
            with valkey_errors("metrics store"):
                self._add(keys=[self.key], args=args)

    def totals(self) -> MetricsDelta:
        """Every metric of the service as totals: counters, sums and counts, gauges."""
        with valkey_errors("metrics store"):
            raw = cast(dict[bytes, bytes], self.client.hgetall(self.key))
        totals = MetricsDelta()
        # Counters and counts are integers, sums and gauges floats.
        integral = {"c": totals.counters, "n": totals.counts}
        real = {"s": totals.sums, "g": totals.gauges}
        for field, value in raw.items():
            text = field.decode()
            if text[0] == "b":
                totals.buckets[_bucket_of(text)] = int(value)
            elif text[0] in integral:
                integral[text[0]][_key_of(text)] = int(value)
            else:
                real[text[0]][_key_of(text)] = float(value)
        return totals

    def forget(self, tag: str, value: str) -> int:
        """Delete every series tagged ``tag=value`` (a removed instance or group exports no
        gauge, and a name created again starts from zero); returns how many fields went."""
        with valkey_errors("metrics store"):
            return int(self._forget(keys=[self.key], args=[tag_pattern(tag, value)]))
