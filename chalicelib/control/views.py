"""Control-plane data as the meta service returns it."""
from __future__ import annotations

import json
from typing import Iterable

from ..protocol.models import StorageConfig


def storage_configs_json(storages: Iterable[tuple[StorageConfig, bool]]) -> str:
    """registerInstance's ``storage_configs`` string:
    ``[{"type": "ST_NFS", "global_unique_name": ..., "is_available": true, "storage_spec": {...}}]``.

    Spec numbers stay JSON numbers (upstream writes this string with its own JSON writer,
    not with proto3-JSON's int64-as-string rule).
    """
    entries = [{"type": config.storage_type.name,
                "global_unique_name": config.global_unique_name,
                "is_available": available,
                "storage_spec": config.spec.model_dump() if config.spec is not None else {}}
               for config, available in storages]
    return json.dumps(entries, separators=(",", ":"))
