"""Upstream's ``local`` storage (``ST_DUMMY``, ``local {root_path, key_count_per_file}``),
which its pruning and multi-location cases add: a file backend on KVCM's own disk.

The layout, URIs (``file://<name>/<root_path>/<instance>/<spec>/<hex key>``), deletion and
existence checks are the NFS backend's; only the spec and the type differ. Only a process
that shares a disk with the engines can use it: ``make run`` (one process, the engines on
the same machine). On Lambda the disk is each container's own ``/tmp``, not shared with
other containers or engines, and emptied with the container (docs/api-v2.md).
"""

from __future__ import annotations

from ..protocol.codes import StorageType
from ..protocol.models import StorageConfig
from .checks import require_absolute, spec_of
from .file import FileBackend, check_key_count


class LocalBackend(FileBackend):
    """Files under ``local.root_path`` on the manager's disk; engines read them as ``file``."""

    storage_type = StorageType.ST_DUMMY
    spec_field = "local"

    @classmethod
    def check_config(cls, config: StorageConfig) -> None:
        """Raise InvalidArgumentError naming the first invalid ``local`` field."""
        spec = spec_of(config, cls.spec_field)
        require_absolute(config, "local.root_path", spec.root_path)
        check_key_count(config, "local.key_count_per_file", spec.key_count_per_file)
