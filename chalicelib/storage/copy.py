"""Copy blocks' bytes from one storage to another (tiered storage, UPSTREAM_V2 §2.11 "Copy").

The index places the target blocks (their location ids, groups and slots on the target
storage) and keeps them WRITING while this runs; ``copy_blocks`` reads every spec the
target block lists from the source block (by spec name: a target may take a subset of the
source's specs, as upstream's ``DataStorageBackend::Copy`` may) and writes it where the
target's URIs point. Once it returns, the bytes at each target URI equal the source's and
are durable; only then may the index turn the target SERVING.

The bytes go through KVCM's memory, ``batch_blocks`` blocks at a time, on
``concurrency`` threads (a group's ``copy_max_concurrency``). A backend that cannot read or
write its own bytes (the memory pool, Mooncake) raises StorageCopyUnsupportedError before
anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from .base import BlockRef, StorageBackend, StorageError

#: Blocks read into memory at once per thread: bounds a copy's memory to
#: concurrency × batch × block size.
DEFAULT_BATCH_BLOCKS = 16


def source_view(source: BlockRef, target: BlockRef) -> BlockRef:
    """``source`` restricted to the specs ``target`` lists, in the target's order; a spec
    the source lacks, or holds at another size, is a StorageError."""
    by_name = {spec.name: spec for spec in source.specs}
    specs = []
    for spec in target.specs:
        held = by_name.get(spec.name)
        if held is None or held.size != spec.size:
            what = "lacks" if held is None else f"holds {held.size} bytes of"
            raise StorageError(
                f"block {source.block_key}: the source {what} spec {spec.name!r}, which the target takes "
                f"at {spec.size} bytes"
            )
        specs.append(held)
    return replace(source, specs=tuple(specs))


def copy_blocks(
    source: StorageBackend,
    sources: Sequence[BlockRef],
    target: StorageBackend,
    targets: Sequence[BlockRef],
    concurrency: int = 1,
    batch_blocks: int = DEFAULT_BATCH_BLOCKS,
) -> int:
    """Copy ``sources[i]`` (on ``source``) to ``targets[i]`` (on ``target``); the bytes
    copied. Raises StorageError (or StorageCopyUnsupportedError) on the first failure: the
    targets are then partly written and must stay WRITING until deleted."""
    if len(sources) != len(targets):
        raise StorageError(f"{len(sources)} source block(s) for {len(targets)} target block(s)")
    if concurrency < 1 or batch_blocks < 1:
        raise StorageError(f"concurrency ({concurrency}) and batch_blocks ({batch_blocks}) must be >= 1")
    views = [source_view(s, t) for s, t in zip(sources, targets, strict=True)]
    batches = [(views[i : i + batch_blocks], targets[i : i + batch_blocks]) for i in range(0, len(views), batch_blocks)]

    def run(batch: tuple[Sequence[BlockRef], Sequence[BlockRef]]) -> int:
        reads, writes = batch
        target.write(writes, source.read(reads))
        return sum(block.size for block in writes)

    if concurrency == 1 or len(batches) <= 1:
        return sum(map(run, batches))
    with ThreadPoolExecutor(max_workers=min(concurrency, len(batches))) as pool:
        return sum(pool.map(run, batches))
