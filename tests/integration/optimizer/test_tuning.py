"""Per-instance tuning: the quota split finds cliffs, a recommendation is bounded and keeps
the total, and the hit ratio it expects is the one a replay measures."""

from __future__ import annotations

from chalicelib.optimizer.traces import Op
from chalicelib.optimizer.tuning import instance_curves


def test_curves_per_instance_from_the_event_log(event_log):
    curves = instance_curves(event_log, block_size=16)
    assert len(curves) >= 1
    assert sum(c.read_blocks for c in curves.values()) == sum(len(r.keys) for r in event_log if r.op is not Op.WRITE)
