"""KVCM optimizer: trace replay, exact miss-ratio curves, sweeps and capacity reports.

Readers turn Mooncake, Qwen-Bailian, KVCM event-log and upstream-schema traces into one
record stream (:mod:`.traces`); the replay engine runs it through per-instance policies
(:mod:`.policies`, :mod:`.replay`); :mod:`.mrc` computes the exact LRU hit ratio at every
capacity in one pass; :mod:`.sweep`, :mod:`.report` and :mod:`.cost` turn that into
capacity recommendations; :mod:`.tiered` replays several tiers per instance (write-through
or demote) and prices each; :mod:`.tasks` holds the Step Functions task logic and
:mod:`.cli` the command line. See docs/optimizer.md.
"""

from chalicelib.optimizer.cost import CostModel
from chalicelib.optimizer.errors import ConfigError, OptimizerError, TraceFormatError
from chalicelib.optimizer.mrc import HitRatioCurve, lru_curve, shards_error
from chalicelib.optimizer.policies import LFU, LRU, POLICIES, LeafAwareLRU, RandomLRU, make_policy
from chalicelib.optimizer.policy_base import EvictionPolicy
from chalicelib.optimizer.replay import EvictionMode, ReplayConfig, Replayer, ReplayResult, Totals, replay
from chalicelib.optimizer.sweep import GridPoint, SweepSettings, TraceSpec, sweep
from chalicelib.optimizer.traces import FORMATS, Op, Query, Record, read_trace, sniff_format

__all__ = [
    "CostModel",
    "ConfigError",
    "OptimizerError",
    "TraceFormatError",
    "HitRatioCurve",
    "lru_curve",
    "shards_error",
    "LFU",
    "LRU",
    "POLICIES",
    "EvictionPolicy",
    "LeafAwareLRU",
    "RandomLRU",
    "make_policy",
    "EvictionMode",
    "ReplayConfig",
    "Replayer",
    "ReplayResult",
    "Totals",
    "replay",
    "GridPoint",
    "SweepSettings",
    "TraceSpec",
    "sweep",
    "FORMATS",
    "Op",
    "Query",
    "Record",
    "read_trace",
    "sniff_format",
]
