"""Copy throughput between tiers (issue 24): blocks/s and MB/s of ``storage.copy.copy_blocks``
per backend pair (NFS-style files, packed, and S3 in moto), each beside a same-run baseline
moving the same bytes with bare primitives, at the same concurrency:

- the same transfer without KVCM: file -> file is ``shutil.copyfile`` of the source files
  plus an fsync each; a pair with S3 is boto3 GetObject / PutObject and open/pread/pwrite/
  fsync in a plain loop;
- the target's floor: the same bytes, already in memory, written as plain files (fsynced)
  or S3 PUTs.

    .venv/bin/python bench/bench_copy.py [blocks] [spec KiB]
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3

from bench._common import start_local_aws
from chalicelib.protocol.models import StorageConfig
from chalicelib.storage import BlockRef, FileBackend, S3Backend, SpecSlot, StorageBackend, copy_blocks
from chalicelib.storage.copy import DEFAULT_BATCH_BLOCKS
from chalicelib.storage.file import _FileStorage

PACK = 8
CONCURRENCIES = (1, 4)
_ids = itertools.count(1)


def file_backend(root: Path, name: str) -> FileBackend:
    root.mkdir(parents=True)
    config = {"global_unique_name": name, "nfs": {"root_path": str(root), "key_count_per_file": PACK}}
    return FileBackend(StorageConfig.model_validate(config), min_free_bytes=0)


def s3_backend(name: str) -> S3Backend:
    boto3.client("s3").create_bucket(Bucket=name)
    config = {"global_unique_name": name, "s3": {"bucket": name, "prefix": "kv"}}
    return S3Backend(StorageConfig.model_validate(config), lambda: boto3.client("s3"))


def place(backend: StorageBackend, keys: Sequence[int], specs: tuple[SpecSlot, ...]) -> list[BlockRef]:
    """Blocks placed as the index places them (location ids, ``pack_count`` to a file)."""
    locations = [next(_ids) for _ in keys]
    pack = backend.pack_count
    return [
        BlockRef(
            "inst-1",
            key,
            location,
            locations[i - i % pack] if pack else 0,
            i % pack if pack else 0,
            specs,
        )
        for i, (key, location) in enumerate(zip(keys, locations, strict=True))
    ]


def raw_read(backend: StorageBackend, block: BlockRef, spec: SpecSlot) -> bytes:
    if isinstance(backend, S3Backend):
        key = backend.object_key(block.instance_id, spec.name, block.block_key)
        data: bytes = backend.client.get_object(Bucket=backend.bucket, Key=key)["Body"].read()
        return data
    assert isinstance(backend, _FileStorage)
    with open(backend.path(block.instance_id, spec.name, block.group_id), "rb") as handle:
        handle.seek(block.slot * spec.size)
        return handle.read(spec.size)


def raw_write(backend: StorageBackend, block: BlockRef, spec: SpecSlot, data: bytes) -> None:
    if isinstance(backend, S3Backend):
        key = backend.object_key(block.instance_id, spec.name, block.block_key)
        backend.client.put_object(Bucket=backend.bucket, Key=key, Body=data)
        return
    assert isinstance(backend, _FileStorage)
    path = backend.path(block.instance_id, spec.name, block.group_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        os.pwrite(fd, data, block.slot * spec.size)
        if block.slot == PACK - 1 or backend.pack_count <= 1:
            os.fsync(fd)
    finally:
        os.close(fd)


Pairs = Sequence[tuple[BlockRef, BlockRef]]


def bare_transfer(source: StorageBackend, target: StorageBackend) -> Callable[[Pairs], None]:
    """The baseline transfer of a batch of (source block, target block) pairs."""
    if isinstance(source, _FileStorage) and isinstance(target, _FileStorage):

        def copy_files(pairs: Pairs) -> None:
            for s, t in pairs:
                if s.slot:
                    continue  # one copy per packed file
                for spec in s.specs:
                    destination = target.path(t.instance_id, spec.name, t.group_id)
                    os.makedirs(os.path.dirname(destination), exist_ok=True)
                    shutil.copyfile(source.path(s.instance_id, spec.name, s.group_id), destination)
                    fd = os.open(destination, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)

        return copy_files

    def get_put(pairs: Pairs) -> None:
        for s, t in pairs:
            for spec in s.specs:
                raw_write(target, t, spec, raw_read(source, s, spec))

    return get_put


def figures(label: str, seconds: float, blocks: int, block_bytes: int, baseline: float | None = None) -> str:
    rate = blocks / seconds
    mb = blocks * block_bytes / seconds / 1e6
    ratio = f"  {baseline / seconds:.2f}× the baseline's throughput" if baseline else ""
    return f"  {label:<58} {rate:>9.0f} blocks/s {mb:>8.1f} MB/s{ratio}"


def in_batches(work: Callable[[Sequence[Any]], object], items: Sequence[Any], concurrency: int) -> float:
    """Seconds to run ``work`` over ``items`` in DEFAULT_BATCH_BLOCKS batches on ``concurrency`` threads."""
    step = DEFAULT_BATCH_BLOCKS
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        t0 = time.perf_counter()
        list(pool.map(work, [items[i : i + step] for i in range(0, len(items), step)]))
        return time.perf_counter() - t0


def measure(
    source: StorageBackend,
    blocks: Sequence[BlockRef],
    data: list[list[bytes]],
    make_target: Callable[[], StorageBackend],
    concurrency: int,
) -> tuple[float, float, float]:
    """Seconds of (target floor, bare transfer, copy_blocks), each into a fresh target."""
    keys = [b.block_key for b in blocks]
    specs = blocks[0].specs
    floor_target = make_target()
    floor_items = list(zip(place(floor_target, keys, specs), data, strict=True))

    def write_floor(items: Sequence[tuple[BlockRef, list[bytes]]]) -> None:
        for block, payloads in items:
            for spec, payload in zip(block.specs, payloads, strict=True):
                raw_write(floor_target, block, spec, payload)

    floor = in_batches(write_floor, floor_items, concurrency)
    bare_target = make_target()
    bare = in_batches(
        bare_transfer(source, bare_target), list(zip(blocks, place(bare_target, keys, specs), strict=True)), concurrency
    )
    target = make_target()
    targets = place(target, keys, specs)
    t0 = time.perf_counter()
    copy_blocks(source, blocks, target, targets, concurrency=concurrency)
    kvcm = time.perf_counter() - t0
    assert target.read(targets) == data, "the copy must equal the source"
    return floor, bare, kvcm


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    spec_kib = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    specs = (SpecSlot("tp0", 0, spec_kib * 1024), SpecSlot("tp1", spec_kib * 1024, spec_kib * 1024))
    block_bytes = sum(s.size for s in specs)
    aws = start_local_aws()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            made = itertools.count()

            def make(kind: str) -> StorageBackend:
                name = f"{kind}-{next(made)}"
                return file_backend(Path(scratch) / name, name) if kind == "file" else s3_backend(name)

            print(
                f"copy throughput: {count} blocks of {len(specs)} x {spec_kib} KiB, files packed {PACK} to a file, "
                "S3 in moto (in-process HTTP), one run"
            )
            for source_kind, target_kind in (("file", "file"), ("file", "s3"), ("s3", "file"), ("s3", "s3")):
                source = make(source_kind)
                blocks = place(source, range(count), specs)
                data = [[os.urandom(s.size) for s in specs] for _ in blocks]
                source.write(blocks, data)
                floor_label = "plain file write + fsync" if target_kind == "file" else "S3 PUT"
                for concurrency in CONCURRENCIES:
                    floor, bare, kvcm = measure(source, blocks, data, functools.partial(make, target_kind), concurrency)
                    print(f"{source_kind} -> {target_kind}, concurrency {concurrency}")
                    print(figures(f"target floor: {floor_label} of the same bytes", floor, count, block_bytes))
                    print(figures("baseline: the same transfer, bare primitives", bare, count, block_bytes))
                    print(figures("copy_blocks", kvcm, count, block_bytes, bare))
    finally:
        aws.stop()


if __name__ == "__main__":
    main()
