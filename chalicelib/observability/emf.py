"""CloudWatch's embedded metric format (EMF): one JSON line on standard output that Lambda's
log pipeline turns into CloudWatch metrics, with no API call and no permission.

The service's own metrics live in Valkey (``stores.metrics``), which CloudWatch cannot
read; the template's alarms need a few of them in CloudWatch: that a job runs and does not
fail (reclaim and health rounds that stop, deletions and purges that fail) and how many
write sessions expire. Off (``namespace`` empty) outside a deployed stage.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import TextIO

from ..clock import Clock, now_ms


def emf_document(
    namespace: str, dimensions: Mapping[str, str], values: Mapping[str, float], timestamp_ms: int
) -> dict[str, object]:
    """The EMF document of ``values`` (metric name → value, unit Count) under ``dimensions``."""
    return {
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [
                {
                    "Namespace": namespace,
                    "Dimensions": [sorted(dimensions)],
                    "Metrics": [{"Name": name, "Unit": "Count"} for name in sorted(values)],
                }
            ],
        },
        **dimensions,
        **values,
    }


class EmfWriter:
    """Writes EMF lines for ``namespace`` (nothing when it is empty)."""

    def __init__(self, namespace: str, clock: Clock, out: TextIO | None = None) -> None:
        self.namespace = namespace
        self.clock = clock
        self.out = out

    def emit(self, dimensions: Mapping[str, str], values: Mapping[str, float]) -> None:
        """One line of ``values`` under ``dimensions``; never raises."""
        if not self.namespace or not values:
            return
        line = json.dumps(emf_document(self.namespace, dimensions, values, now_ms(self.clock)), separators=(",", ":"))
        try:
            print(line, file=self.out or sys.stdout, flush=True)
        except (OSError, ValueError):  # a closed stdout must not fail a job
            pass
