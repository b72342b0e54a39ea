"""Capacity: watermarks, victim choice and the reclaimer (API.md, "Capacity").

What the rest of the service calls:

- ``ReclaimJob.run()`` — one reclaim round; app.py's ``@app.schedule`` handler and the
  local scheduler (every second) call it;
- ``ReclaimJob.wake(group_name)`` — the data plane's hook when a write is refused for
  capacity: the group is reclaimed in the next round. Cheap, never raises.

Pure core: ``watermark`` (how much to free), ``policies`` (who goes first), ``selection``
(the candidate pool, leaves only). I/O through the index only: ``sampling``,
``instance``, ``stranded`` (deletions whose hand-off was lost) and ``reclaimer``;
``eviction`` makes room on the write path; ``coldest.coldest_blocks`` is the sampled
selection of the coldest blocks on a storage (the tier triggers, migrateCache's
``rule.sample_count``).
"""

from .coldest import coldest_blocks
from .policies import Candidate, LFUPolicy, LRUPolicy, TTLPolicy, VictimPolicy, policy_for
from .reclaimer import ControlDirectory, GroupReport, Reclaimer, ReclaimJob, ReclaimReport
from .sampling import SamplingConfig
from .watermark import Limits, Need, Plan, assess, split

__all__ = [
    "Candidate",
    "ControlDirectory",
    "GroupReport",
    "LFUPolicy",
    "LRUPolicy",
    "Limits",
    "Need",
    "Plan",
    "ReclaimJob",
    "ReclaimReport",
    "Reclaimer",
    "SamplingConfig",
    "TTLPolicy",
    "VictimPolicy",
    "assess",
    "coldest_blocks",
    "policy_for",
    "split",
]
