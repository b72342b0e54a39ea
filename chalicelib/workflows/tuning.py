"""The scheduled per-instance tuning job (app.py's ``instance_tuning`` schedule): the
control plane adapted to what ``optimizer.instance_tuning`` needs, and the job built over
the event log ``KVCM_EVENT_LOG`` names (S3 or a local directory); its recommendations
are written beside the events (``<prefix>/tuning/<group>/...``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..control import ControlPlane, VersionConflictError
from ..control.groups import default_tuning
from ..observability.event_store import is_partitioned
from ..observability.logging import logger
from ..protocol.models import InstanceGroup
from ..storage.objects import open_store


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


class NoEventLog:
    """The job when the event log is not kept where it can be read back."""

    def run(self) -> dict[str, Any]:
        return {"skipped": "KVCM_EVENT_LOG names no S3 bucket or directory (s3://bucket/prefix, dir:/path)"}


def instance_tuning(
    control: ControlPlane, event_log: str, s3_client: Callable[[], Any], clock: Any
) -> InstanceTuningJob:
    """The tuning job over ``event_log`` (a ``KVCM_EVENT_LOG`` value)."""
    if not is_partitioned(event_log):
        return NoEventLog()
    # Imported when built: the optimizer costs the API's cold start a third of a second.
    from ..optimizer.instance_tuning import EventLogSource, InstanceTuning

    store, prefix = open_store(event_log, s3_client)
    return InstanceTuning(
        ControlGroups(control), EventLogSource(store, prefix), store, clock, logger, output_prefix=prefix
    )
