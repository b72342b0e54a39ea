"""Control-plane data as the meta service returns it."""

from __future__ import annotations

import json
from collections.abc import Iterable

from ..protocol.models import StorageConfig
from ..storage.registry import sdk_entry


def storage_configs_json(storages: Iterable[tuple[StorageConfig, bool]]) -> str:
    """registerInstance's ``storage_configs`` string, which engine SDKs parse to build their
    backends: ``[{"type": "file", "is_available": true, "global_unique_name": ...,
    "storage_spec": {...}}]`` with upstream's type strings and spec field names.

    Spec numbers stay JSON numbers (upstream writes this string with its own JSON writer,
    not with proto3-JSON's int64-as-string rule).
    """
    return json.dumps([sdk_entry(config, available) for config, available in storages], separators=(",", ":"))
