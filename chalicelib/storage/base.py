"""The port every data storage backend implements.

A backend turns a block's placement into URIs for the engines, deletes data when the index
drops a block, and answers health probes. Engines move the KV bytes; KVCM moves them only to
copy a block from one tier to another (``read`` and ``write``, used by ``storage.copy``).

Placement. Every location records a ``group_id`` and a ``slot``:

- file-like backends (nfs, 3fs) pack ``pack_count`` blocks of one startWriteCache call
  into one file per spec. The index assigns ``group_id`` = the location id of the first
  block of the file and ``slot`` = the block's index in it (``blkid``), and keeps a live
  count per group so the file is deleted only when its last block is gone
  (``delete_groups``). ``pack_count`` 1 gives a file per block.
- backends that allocate (the memory pool) return explicit ``group_id`` values
  (addresses) from ``reserve`` and get unused ones back through ``unreserve``.
- the rest (S3, Mooncake) address a block by instance, spec and key; ``group_id`` is 0.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..protocol.codes import StorageType
from ..protocol.errors import StorageIOError, UnsupportedError
from ..protocol.models import StorageConfig
from .checks import spec_of


class StorageError(StorageIOError):
    """Base of the storage backends' errors (wire code IO_ERROR)."""


class StorageUnavailableError(StorageError):
    """A health probe failed."""


class StorageFullError(StorageUnavailableError):
    """A health probe found the storage without the free space it must keep: its data can
    still be read, but nothing new may be placed on it."""


class StorageCopyUnsupportedError(UnsupportedError):
    """The backend cannot read or write block bytes from KVCM (wire UNSUPPORTED), so blocks
    cannot be copied from or to it."""


#: ``args(block_key, location_id, group_id, slot)``: the values a URI template takes.
UriArgs = Callable[[int, int, int, int], tuple[int, ...]]


@dataclass(frozen=True)
class UriFormat:
    """The URI of one spec, for every block of one instance:
    ``template % args(block_key, location_id, group_id, slot)``.

    The hot path renders hundreds of URIs per call, so everything that does not depend on
    the block is rendered once into ``template`` (its literal ``%`` doubled), and ``args``
    yields only URI-safe text (digits, hex, escaped components): a URI never needs JSON
    escaping beyond what the template's static text gets once.
    """

    template: str
    args: UriArgs

    def render(self, block_key: int, location_id: int, group_id: int, slot: int) -> str:
        return self.template % self.args(block_key, location_id, group_id, slot)


@dataclass(frozen=True)
class SpecSlot:
    """One spec of a block: its name, byte offset inside the block and size."""

    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class BlockRef:
    """Everything a backend needs to address one stored block."""

    instance_id: str
    block_key: int
    location_id: int
    group_id: int
    slot: int
    specs: tuple[SpecSlot, ...]

    @property
    def size(self) -> int:
        return sum(s.size for s in self.specs)


def check_shapes(storage: str, blocks: Sequence[BlockRef], data: Sequence[Sequence[bytes]]) -> None:
    """Fail (StorageError, nothing written) unless ``data`` holds one payload of exactly its
    spec's size per spec of every block: a short payload would leave a block half written."""
    if len(data) != len(blocks):
        raise StorageError(f"storage {storage}: {len(data)} payload(s) for {len(blocks)} block(s)")
    for block, payloads in zip(blocks, data, strict=True):
        sizes = [len(p) for p in payloads]
        if sizes != [s.size for s in block.specs]:
            raise StorageError(
                f"storage {storage}: block {block.block_key} has specs of "
                f"{[s.size for s in block.specs]} bytes, got payloads of {sizes}"
            )


class StorageBackend(ABC):
    """A data storage (one ``StorageConfig``)."""

    storage_type: StorageType = StorageType.ST_UNSPECIFIED
    #: The type as upstream's engine SDK names it: the ``type`` of the storage's
    #: ``storage_configs`` entry and the scheme of its URIs (``file``, ``hf3fs``,
    #: ``vcns_hf3fs``, ``mooncake``, ``pace``; types KVCM adds use their own names).
    sdk_type: str = ""
    #: The member of StorageConfig's storage-spec oneof this backend serves (``nfs``, ``s3``...).
    spec_field: ClassVar[str] = ""
    #: Fixed weight for choosing among replicas on read: lower is faster.
    read_weight: int = 5
    #: True when the storage evicts its own data and KVCM only drops metadata.
    owner_evicted: bool = False

    def __init__(self, config: StorageConfig) -> None:
        self.config = config

    @classmethod
    def sdk_spec(cls, config: StorageConfig) -> dict[str, Any]:
        """The ``storage_spec`` of ``config``'s ``storage_configs`` entry: the fields
        upstream's engine SDK reads for this type, under its names (here: the spec as is)."""
        spec: dict[str, Any] = spec_of(config, cls.spec_field).model_dump()
        return spec

    @classmethod
    def check_config(cls, config: StorageConfig) -> None:
        """Raise InvalidArgumentError naming the first invalid field of ``config``'s spec
        (every backend of the registry checks its own; the base has nothing to check)."""

    @property
    def name(self) -> str:
        return self.config.global_unique_name

    @property
    def pack_count(self) -> int:
        """Blocks per placement group (file) for backends whose data lives in groups the
        index counts (file backends: ``delete_groups`` runs after the last block is gone);
        0 for backends addressed per block (``delete`` runs before the metadata goes)."""
        return 0

    def reserve(self, instance_id: str, count: int, block_bytes: int) -> list[int] | None:
        """Explicit group ids for ``count`` new blocks, or None when the index assigns them."""
        return None

    def unreserve(self, instance_id: str, group_ids: Sequence[int], block_bytes: int) -> None:
        """Give back reservations that were not used (a key turned out to exist)."""

    def prepare(self, blocks: Sequence[BlockRef]) -> None:
        """Get new blocks' data place ready before engines write (e.g. create empty files).

        Called once the index has placed ``blocks``; a no-op for most backends.
        """

    @abstractmethod
    def uri_format(self, instance_id: str, spec: SpecSlot) -> UriFormat:
        """How URIs of one spec of an instance's blocks are made; their host is always
        ``global_unique_name``."""

    def uri(self, block: BlockRef, spec: SpecSlot) -> str:
        """The URI of one spec of a block."""
        return self.uri_format(block.instance_id, spec).render(
            block.block_key, block.location_id, block.group_id, block.slot
        )

    @abstractmethod
    def delete(self, blocks: Sequence[BlockRef]) -> None:
        """Delete the data of blocks that are not packed. Idempotent: missing data is fine."""

    def delete_groups(self, instance_id: str, group_ids: Sequence[int], specs: Sequence[SpecSlot]) -> None:
        """Delete packed files whose last block is gone. Idempotent."""

    @abstractmethod
    def exists(self, block: BlockRef) -> bool:
        """Whether the data of ``block`` is present (every spec)."""

    def might_exist(self, blocks: Sequence[BlockRef]) -> list[bool | None]:
        """Per block: False when the storage definitively reports its data missing, True
        when it is present (or may be: an owner-evicted storage cannot tell), None when the
        storage could not answer. Backends with a batch probe override this; the default
        asks ``exists`` block by block."""
        results: list[bool | None] = []
        for block in blocks:
            try:
                results.append(self.exists(block))
            except StorageError:
                results.append(None)
        return results

    def read(self, blocks: Sequence[BlockRef]) -> list[list[bytes]]:
        """The bytes of every spec of every block (``[block][spec]``), as an engine reads
        them at the blocks' URIs; StorageError when a spec is missing or shorter than its
        size. Backends that cannot read their data raise StorageCopyUnsupportedError."""
        raise StorageCopyUnsupportedError(f"storage {self.name}: {self.sdk_type} blocks cannot be read by KVCM")

    def write(self, blocks: Sequence[BlockRef], data: Sequence[Sequence[bytes]]) -> None:
        """Store ``data[i][j]`` (exactly ``blocks[i].specs[j].size`` bytes) where the URI of
        spec j of block i points, durably before returning; StorageError on failure.
        Backends that cannot write their data raise StorageCopyUnsupportedError."""
        raise StorageCopyUnsupportedError(f"storage {self.name}: {self.sdk_type} blocks cannot be written by KVCM")

    @abstractmethod
    def probe(self) -> None:
        """Check the storage can be used now; raise ``StorageUnavailableError`` if not."""
