"""The scheduled per-instance tuning job (app.py's ``instance_tuning`` schedule): the
control plane adapted to what ``optimizer.instance_tuning`` needs, and the job built over
the live hit-ratio curves (``hit_curves``) and the event log ``KVCM_EVENT_LOG`` names (S3
or a local directory); its recommendations are written beside the events
(``<prefix>/tuning/<group>/...``) and beside the curves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..control import ControlPlane, VersionConflictError
from ..control.groups import default_tuning
from ..observability.event_store import is_partitioned
from ..observability.logging import logger
from ..protocol.models import InstanceGroup
from ..storage.objects import open_store
from .hit_curves import LiveCurves


class ControlGroups:
    """``optimizer.instance_tuning.Groups`` over the control plane."""

    def __init__(self, control: ControlPlane) -> None:
        self.control = control

    def groups(self) -> list[InstanceGroup]:
        groups = self.control.list_groups()
        for group in groups:
            group.tuning = group.tuning or default_tuning()
        return groups

    def block_bytes(self, group: str) -> dict[str, int]:
        return {r.instance_id: sum(s.size for s in r.location_spec_infos) for r in self.control.list_instances(group)}

    def update(self, group: InstanceGroup, current_version: int) -> bool:
        try:
            self.control.update_group(group, current_version)
        except VersionConflictError:
            return False
        return True


class InstanceTuningJob(Protocol):
    def run(self) -> dict[str, Any]:
        """Tune every group; a summary per group."""


def instance_tuning(
    control: ControlPlane, event_log: str, s3_client: Callable[[], Any], clock: Any, live: LiveCurves
) -> InstanceTuningJob:
    """The tuning job over the groups' live curves and ``event_log`` (a ``KVCM_EVENT_LOG``
    value: without a readable one, the quotas are tuned from the live curves alone, the
    reclaim parameter not at all, and the recommendations are kept beside the curves only)."""
    # Imported when built: the optimizer costs the API's cold start a third of a second.
    from ..optimizer.instance_tuning import EventLogSource, InstanceTuning

    if not is_partitioned(event_log):
        return InstanceTuning(ControlGroups(control), None, None, clock, logger, live=live)
    store, prefix = open_store(event_log, s3_client)
    return InstanceTuning(
        ControlGroups(control), EventLogSource(store, prefix), store, clock, logger, output_prefix=prefix, live=live
    )
