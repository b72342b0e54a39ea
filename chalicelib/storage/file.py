"""File storages: NFS-style mounts (EFS, FSx, NFS) and 3FS, plain or VCNS.

Layout. Data of one (instance, spec, placement group) lives in one file::

    <data root>/<instance id>/<spec name>/<group id as 16 hex digits>

where the instance id and spec name are escaped (``naming.escape_component``), so no user
string can leave the data root. With ``key_count_per_file`` N > 1 a file holds N blocks
of one startWriteCache call, block ``slot`` at byte ``slot * spec size``; the index keeps
the file's live count and calls ``delete_groups`` when it reaches zero. With N ≤ 1 every
block has its own file (a group of one, whose id is the block's location id); the index
deletes it the same way, and ``delete`` removes it too.

Engines create and fill the files. KVCM removes them, checks them, creates empty ones when
a 3FS storage asks for it (``prepare``), reads and writes blocks only to copy them between
tiers (``read``, ``write``: at the block's slot, as engines do, fsynced), and writes a
probe file for health; the probe also reads the filesystem's free space (``statvfs``): under
``min_free_bytes`` the storage is full (StorageFullError), since engines would then get
locations they cannot write (ENOSPC). It never creates the data root: a missing data root means a
missing mount and must fail the probe, not be papered over on the local disk.

URIs are what upstream's engine SDK reads (API.md, "What engine SDKs parse"): the scheme
is the upstream type, the host the storage's ``global_unique_name``, the path the file's
absolute path on the engine's mount, and the block sits at byte ``blkid × size``:

- NFS: ``file://<name><root_path>/<instance>/<spec>/<group hex>?blkid=<slot>&size=<spec size>``
- 3FS: ``hf3fs://<name><mountpoint>/<root_dir>/<instance>/<spec>/<group hex>?blkid=..&size=..``
  (``vcns_hf3fs://`` for 3FS over VCNS; engines mount 3FS at the same mountpoint).

``blkid`` is present whenever ``key_count_per_file`` > 1, as upstream writes it.
"""

from __future__ import annotations

import errno
import functools
import os
import posixpath
import stat
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..observability.logging import logger
from ..protocol.codes import StorageType
from ..protocol.models import StorageConfig
from .base import (
    BlockRef,
    SpecSlot,
    StorageBackend,
    StorageError,
    StorageFullError,
    StorageUnavailableError,
    UriFormat,
    check_shapes,
)
from .checks import config_error, require, require_absolute, require_contained, require_non_negative, spec_of
from .naming import DECIMAL, HEX64, escape_component, hex64, uri_template

PROBE_PREFIX = ".kvcm-probe-"
#: The index stores a block's slot in 16 bits.
MAX_KEY_COUNT_PER_FILE = 1 << 16
_MISSING = (FileNotFoundError, NotADirectoryError)
_DIRECTORY_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FreeSpace:
    """What a filesystem has left for an unprivileged writer, and its size, in bytes."""

    free_bytes: int
    total_bytes: int


def statvfs_free_space(path: str) -> FreeSpace:
    """The free space of the filesystem holding ``path`` (``statvfs``: the blocks available
    to a non-root writer, as the engines are)."""
    result = os.statvfs(path)
    return FreeSpace(result.f_bavail * result.f_frsize, result.f_blocks * result.f_frsize)


#: ``free_space(path)``: how the probe reads free space (tests inject their own).
FreeSpaceProbe = Callable[[str], FreeSpace]
#: Free space a file storage keeps by default (Settings.storage_min_free_bytes).
DEFAULT_MIN_FREE_BYTES = 64 * 1024 * 1024


def check_key_count(config: StorageConfig, field: str, value: int) -> None:
    """``key_count_per_file``: 0 (one block per file) up to ``MAX_KEY_COUNT_PER_FILE``."""
    require_non_negative(config, field, value)
    if value > MAX_KEY_COUNT_PER_FILE:
        raise config_error(config, field, f"must be <= {MAX_KEY_COUNT_PER_FILE}, got {value}")


class _FileStorage(StorageBackend):
    """What NFS and 3FS share: the layout, URIs, deletion, existence and the probe."""

    def __init__(
        self,
        config: StorageConfig,
        data_root: str,
        key_count_per_file: int,
        min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
        free_space: FreeSpaceProbe = statvfs_free_space,
    ) -> None:
        super().__init__(config)
        self.data_root = os.path.normpath(data_root)
        self.min_free_bytes = min_free_bytes
        self._free_space = free_space
        # One leading slash: normpath keeps a leading "//", which would read as a URI authority.
        self._uri_root = posixpath.normpath("/" + self.data_root.strip("/"))
        self._pack = max(1, key_count_per_file)
        # Per backend, so a backend replaced by a new config version is not kept alive by a cache.
        self._uri_template = functools.lru_cache(maxsize=4096)(self._build_uri_template)

    @classmethod
    def sdk_spec(cls, config: StorageConfig) -> dict[str, Any]:
        """The spec as upstream writes it for its SDK: ``key_count_per_file`` as the URIs
        follow it (0 packs one block per file, upstream's default of 1), and without
        ``touch_file_when_create`` (only KVCM acts on it)."""
        spec: dict[str, Any] = spec_of(config, cls.spec_field).model_dump(exclude={"touch_file_when_create"})
        spec["key_count_per_file"] = max(1, spec["key_count_per_file"])
        return spec

    @property
    def pack_count(self) -> int:
        return self._pack

    def _relative(self, instance_id: str, spec_name: str, group_id: int) -> str:
        return posixpath.join(escape_component(instance_id), escape_component(spec_name), hex64(group_id))

    def path(self, instance_id: str, spec_name: str, group_id: int) -> str:
        """Absolute path of the file holding ``spec_name`` of a placement group."""
        return os.path.join(self.data_root, self._relative(instance_id, spec_name, group_id))

    def _build_uri_template(self, instance_id: str, spec_name: str, size: int) -> str:
        directory = posixpath.join(self._uri_root, escape_component(instance_id), escape_component(spec_name))
        params = (("blkid", DECIMAL), ("size", size)) if self._pack > 1 else (("size", size),)
        # Group ids are non-negative (index-assigned location ids): no two's complement needed.
        return uri_template(self.sdk_type, self.name, (directory + "/", HEX64), params)

    def uri_format(self, instance_id: str, spec: SpecSlot) -> UriFormat:
        return UriFormat(
            self._uri_template(instance_id, spec.name, spec.size), _packed_args if self._pack > 1 else _file_args
        )

    def delete(self, blocks: Sequence[BlockRef]) -> None:
        """Remove the files of unpacked blocks; packed files go through ``delete_groups``."""
        if self._pack > 1:
            return
        self._remove(self.path(b.instance_id, s.name, b.group_id) for b in blocks for s in b.specs)

    def delete_groups(self, instance_id: str, group_ids: Sequence[int], specs: Sequence[SpecSlot]) -> None:
        """Remove every spec file of the given placement groups."""
        self._remove(self.path(instance_id, s.name, g) for g in group_ids for s in specs)

    def _parent_fd(self, path: str, create: bool = False) -> tuple[int, str]:
        """(an open descriptor of the directory holding ``path``, the file's name), the
        directories below the data root opened one by one without following a symbolic
        link: anyone who can write to the mount could otherwise point an instance or
        spec directory elsewhere and have KVCM delete, read, write or vouch for files there.
        A link on the way reads as a missing directory (FileNotFoundError /
        NotADirectoryError). ``create`` makes the missing directories below the data root."""
        *directories, name = os.path.relpath(path, self.data_root).split(os.sep)
        fd = os.open(self.data_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for directory in directories:
                if directory in ("", ".", ".."):  # never: paths are built from escaped names
                    raise FileNotFoundError(f"{path} leaves the data root")
                if create:
                    try:
                        os.mkdir(directory, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass
                inner = os.open(directory, _DIRECTORY_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd, name

    def _warn_if_linked(self, path: str) -> None:
        """Log a link found where a KVCM directory should be (it was not followed)."""
        relative = os.path.relpath(path, self.data_root).split(os.sep)
        for depth in range(1, len(relative)):
            candidate = os.path.join(self.data_root, *relative[:depth])
            if os.path.islink(candidate):
                logger.warning("storage %s: %s is a symbolic link; not followed", self.name, candidate)
                return

    def _remove(self, paths: Iterable[str]) -> None:
        # Try every file before failing, so one bad file does not keep the others alive.
        failures = []
        for path in paths:
            try:
                fd, name = self._parent_fd(path)
                try:
                    os.unlink(name, dir_fd=fd)  # unlinkat: a link as the file itself is removed, not followed
                finally:
                    os.close(fd)
            except _MISSING:
                self._warn_if_linked(path)
            except OSError as exc:
                failures.append(f"{path}: {exc.strerror or exc}")
        if failures:
            raise StorageError(
                f"storage {self.name}: could not delete {len(failures)} file(s): {'; '.join(failures[:3])}"
            )

    def exists(self, block: BlockRef) -> bool:
        """Every spec file exists as a regular file below the data root (no link followed)
        and is long enough to hold the block's slot.

        Engines write in place into files that may have been created empty, so presence
        alone does not prove the block was written.
        """
        for spec in block.specs:
            path = self.path(block.instance_id, spec.name, block.group_id)
            try:
                fd, name = self._parent_fd(path)
                try:
                    status = os.stat(name, dir_fd=fd, follow_symlinks=False)
                finally:
                    os.close(fd)
            except _MISSING:
                return False
            except OSError as exc:
                raise StorageError(f"storage {self.name}: cannot stat {path}: {exc.strerror or exc}") from exc
            if not stat.S_ISREG(status.st_mode) or status.st_size < (block.slot + 1) * spec.size:
                return False
        return True

    def _open(self, path: str, flags: int, create: bool = False) -> int:
        fd, name = self._parent_fd(path, create)
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=fd)
        finally:
            os.close(fd)

    def _spec_files(self, blocks: Sequence[BlockRef]) -> dict[str, list[tuple[int, int, int, SpecSlot]]]:
        """Per file: (block index, spec index, byte offset, spec) of every spec it holds."""
        files: dict[str, list[tuple[int, int, int, SpecSlot]]] = {}
        for i, block in enumerate(blocks):
            for j, spec in enumerate(block.specs):
                path = self.path(block.instance_id, spec.name, block.group_id)
                files.setdefault(path, []).append((i, j, block.slot * spec.size, spec))
        return files

    def read(self, blocks: Sequence[BlockRef]) -> list[list[bytes]]:
        """Each spec at byte ``slot × size`` of its file (each file opened once)."""
        out: list[list[bytes]] = [[b""] * len(block.specs) for block in blocks]
        for path, pieces in self._spec_files(blocks).items():
            try:
                fd = self._open(path, os.O_RDONLY)
                try:
                    for i, j, offset, spec in pieces:
                        data = os.pread(fd, spec.size, offset)
                        if len(data) != spec.size:
                            raise StorageError(
                                f"storage {self.name}: {path} holds {len(data)} of the {spec.size} bytes "
                                f"at offset {offset}"
                            )
                        out[i][j] = data
                finally:
                    os.close(fd)
            except OSError as exc:
                raise StorageError(f"storage {self.name}: cannot read {path}: {exc.strerror or exc}") from exc
        return out

    def write(self, blocks: Sequence[BlockRef], data: Sequence[Sequence[bytes]]) -> None:
        """Each spec at byte ``slot × size`` of its file, created with its directories when
        missing (never truncated: a packed file holds other blocks), fsynced once per file."""
        check_shapes(self.name, blocks, data)
        for path, pieces in self._spec_files(blocks).items():
            try:
                fd = self._open(path, os.O_WRONLY | os.O_CREAT, create=True)
                try:
                    for i, j, offset, _ in pieces:
                        _pwrite_all(fd, data[i][j], offset)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                error = StorageFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StorageError
                raise error(f"storage {self.name}: cannot write {path}: {exc.strerror or exc}") from exc

    def might_exist(self, blocks: Sequence[BlockRef]) -> list[bool | None]:
        """``exists`` per block, but unknown for all when the data root itself is not
        there: a storage that is not mounted has not lost its data."""
        if not os.path.isdir(self.data_root):
            return [None] * len(blocks)
        return super().might_exist(blocks)

    def probe(self) -> None:
        """Create, write, fsync and remove a uniquely named file in the data root, then
        check the free space: StorageUnavailableError when the file cannot be written,
        StorageFullError when the filesystem is out of space or under ``min_free_bytes``."""
        self._write_probe_file()
        try:
            space = self._free_space(self.data_root)
        except OSError as exc:
            raise StorageUnavailableError(
                f"storage {self.name}: cannot read the free space of {self.data_root}: {exc.strerror or exc}"
            ) from exc
        if space.free_bytes < self.min_free_bytes:
            raise StorageFullError(
                f"storage {self.name}: full: {_mib(space.free_bytes)} free of {_mib(space.total_bytes)} "
                f"in {self.data_root}, under the {_mib(self.min_free_bytes)} it keeps free"
            )

    def _write_probe_file(self) -> None:
        path = os.path.join(self.data_root, f"{PROBE_PREFIX}{uuid.uuid4().hex}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, b"kvcm health probe\n")
                # fsync makes a network filesystem commit to its server: a dead server fails here.
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(path)
        except OSError as exc:
            error = StorageFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StorageUnavailableError
            raise error(f"storage {self.name}: cannot write in {self.data_root}: {exc.strerror or exc}") from exc


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def _packed_args(block_key: int, location_id: int, group_id: int, slot: int) -> tuple[int, ...]:
    return group_id, slot


def _file_args(block_key: int, location_id: int, group_id: int, slot: int) -> tuple[int, ...]:
    return (group_id,)


class FileBackend(_FileStorage):
    """An NFS-style mount (``nfs{root_path, key_count_per_file}``); URIs carry the absolute path."""

    storage_type = StorageType.ST_NFS
    spec_field = "nfs"
    sdk_type = "file"
    read_weight = 5

    def __init__(
        self,
        config: StorageConfig,
        min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
        free_space: FreeSpaceProbe = statvfs_free_space,
    ) -> None:
        self.check_config(config)
        spec = spec_of(config, self.spec_field)
        super().__init__(config, spec.root_path, spec.key_count_per_file, min_free_bytes, free_space)

    @classmethod
    def check_config(cls, config: StorageConfig) -> None:
        """Raise InvalidArgumentError naming the first invalid ``nfs`` field."""
        spec = spec_of(config, cls.spec_field)
        require_absolute(config, "nfs.root_path", spec.root_path)
        check_key_count(config, "nfs.key_count_per_file", spec.key_count_per_file)


class ThreeFSBackend(_FileStorage):
    """A 3FS mount (``threefs{mountpoint, root_dir, key_count_per_file, touch_file_when_create}``).

    The data root is ``mountpoint/root_dir``, on KVCM's host and on the engines' alike.
    With ``touch_file_when_create``, ``prepare``
    (called by startWriteCache for new blocks) creates their files empty, for engines
    whose 3FS client expects the file to exist before it writes.
    """

    storage_type = StorageType.ST_3FS
    spec_field = "threefs"
    sdk_type = "hf3fs"
    read_weight = 3

    def __init__(
        self,
        config: StorageConfig,
        min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
        free_space: FreeSpaceProbe = statvfs_free_space,
    ) -> None:
        self.check_config(config)
        spec = spec_of(config, self.spec_field)
        data_root = os.path.join(spec.mountpoint, spec.root_dir.strip("/"))
        super().__init__(config, data_root, spec.key_count_per_file, min_free_bytes, free_space)
        self.touch_file_when_create = spec.touch_file_when_create

    @classmethod
    def check_config(cls, config: StorageConfig) -> None:
        """Raise InvalidArgumentError naming the first invalid 3FS field."""
        field = cls.spec_field
        spec = spec_of(config, field)
        require_absolute(config, f"{field}.mountpoint", spec.mountpoint)
        # Upstream refuses an empty root_dir too; connectors expect it as the first path part.
        require(config, f"{field}.root_dir", spec.root_dir.strip("/"))
        require_contained(config, f"{field}.root_dir", spec.root_dir)
        check_key_count(config, f"{field}.key_count_per_file", spec.key_count_per_file)

    def prepare(self, blocks: Sequence[BlockRef]) -> None:
        """Create the missing spec files of ``blocks`` (and their directories), empty."""
        if not self.touch_file_when_create:
            return
        paths = {self.path(b.instance_id, s.name, b.group_id) for b in blocks for s in b.specs}
        for path in sorted(paths):
            spec_dir = os.path.dirname(path)
            try:
                # Only the instance and spec levels: a missing data root is a missing mount.
                for directory in (os.path.dirname(spec_dir), spec_dir):
                    try:
                        os.mkdir(directory)
                    except FileExistsError:
                        pass
                # No O_TRUNC: a packed file may already hold other blocks' data.
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666))
            except OSError as exc:
                raise StorageError(f"storage {self.name}: cannot create {path}: {exc.strerror or exc}") from exc


class VcnsThreeFSBackend(ThreeFSBackend):
    """3FS reached through VCNS: same files and probe, plus the remote endpoint fields."""

    storage_type = StorageType.ST_VCNS_3FS
    spec_field = "vcnsthreefs"
    sdk_type = "vcns_hf3fs"

    @classmethod
    def check_config(cls, config: StorageConfig) -> None:
        """The 3FS checks plus a valid ``remote_port``."""
        super().check_config(config)
        port = spec_of(config, cls.spec_field).remote_port
        if not 0 <= port < 65536:
            raise config_error(config, "vcnsthreefs.remote_port", f"must be a TCP port, got {port}")

    @property
    def remote_host(self) -> str:
        return str(spec_of(self.config, self.spec_field).remote_host)

    @property
    def remote_port(self) -> int:
        return int(spec_of(self.config, self.spec_field).remote_port)

    @property
    def meta_storage_uri(self) -> str:
        return str(spec_of(self.config, self.spec_field).meta_storage_uri)
