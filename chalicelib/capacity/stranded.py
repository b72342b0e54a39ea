"""Deletions that never finished, found by a slow sweep and handed to deletion again.

A location is DELETING from its mark until its deletion drops it: seconds, plus the
group's ``delay_before_delete_ms``. When the hand-off fails (the storage or Step Functions
refused it, a batch ran out of retries) nothing else would pick it up again: the key
could never be written again and its bytes would stay counted. The index scripts stamp a
record's access time when its location turns DELETING; the reclaimer sweeps a few
instances per round (the occupied buckets of each, a window per visit) and re-submits
the locations DELETING for longer than the delay plus ``BlockIndex.DELETION_LOST_AFTER_S``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..index import Status
from ..index.records import last_access_s, location_ids


def stranded_locations(records: Iterable[tuple[int, bytes]], deleting_since_s: int) -> list[tuple[int, int]]:
    """(block key, location id) of the DELETING locations of ``records`` ((block key, raw
    record) pairs) whose record turned DELETING at or before ``deleting_since_s``."""
    return [
        (key, location)
        for key, raw in records
        if last_access_s(raw) <= deleting_since_s
        for location in location_ids(raw, Status.DELETING)
    ]
