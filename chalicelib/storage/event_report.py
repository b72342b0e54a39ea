"""Event-report storages (``ST_EVENT_REPORT_L1P5`` / ``ST_EVENT_REPORT_L2``, UPSTREAM_V2 §2.1):
the blocks engines hold themselves and report through reportEvent.

KVCM keeps only their metadata (``index.reporters``): it never creates, reads or deletes
their data, so they take no writes, count toward no quota and are never reclaimed. A group
names them in ``event_report_storage_candidates``, not in ``storage_candidates``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..protocol.errors import UnsupportedError
from ..protocol.models import StorageConfig
from .base import BlockRef, SpecSlot, StorageBackend, UriFormat
from .checks import config_error, spec_of


class EventReportBackend(StorageBackend):
    spec_field = "event_report"
    sdk_type = "event_report"

    def __init__(self, config: StorageConfig) -> None:
        super().__init__(config)
        self.storage_type = config.storage_type

    @classmethod
    def check_config(cls, config: StorageConfig) -> None:
        """Raise InvalidArgumentError naming the first negative ``event_report`` setting."""
        spec = spec_of(config, cls.spec_field)
        for name, value in spec.model_dump().items():
            if value < 0:
                raise config_error(config, f"event_report.{name}", f"must be >= 0 (ms; 0 = default), got {value}")

    def uri_format(self, instance_id: str, spec: SpecSlot) -> UriFormat:
        raise UnsupportedError(f"storage {self.name!r} holds engine-reported metadata only: KVCM writes no data there")

    def delete(self, blocks: Sequence[BlockRef]) -> None:
        raise UnsupportedError(f"storage {self.name!r} holds engine-reported metadata only: KVCM deletes no data there")

    def exists(self, block: BlockRef) -> bool:
        return False

    def might_exist(self, blocks: Sequence[BlockRef]) -> list[bool | None]:
        """Unknown: the data lives in the engines, which report it themselves."""
        return [None] * len(blocks)

    def probe(self) -> None:
        """Nothing to reach: the data lives in the engines."""
