"""The cost of choosing among a block's copies on several tiers (issue 24, reads across tiers).

    .venv/bin/python bench/bench_tier_reads.py

Renders 128 records the way getCacheLocation does after its read (``LocationRenderer``),
for a group with a route nfs_01 -> 3fs_01 (so the tier order and the read weights
disagree): records of two SERVING copies (the tier choice), the same with a per-type
choice (getCacheLocationsByBackend), and, as the same-run baseline, records of one copy
(the renderer's fast path, which no choice slows).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import row, timeit_interleaved
from chalicelib.cache.context import InstanceContext, SpecLayout, StorageState
from chalicelib.cache.locations import LocationRenderer
from chalicelib.index import InstanceLayout, Status
from chalicelib.index.layout import HEADER, LOCATION
from chalicelib.protocol.codes import StorageType
from chalicelib.protocol.models import InstanceGroup, LocationSpecInfo, StorageConfig
from chalicelib.storage.file import FileBackend, ThreeFSBackend

N = 128
NAMES = {1: "nfs_01", 2: "3fs_01"}


def _record(*copies: tuple[int, int]) -> bytes:
    """A record of SERVING copies, each (storage index, location id)."""
    head = HEADER.pack(0, bytes(8), 0, 0, 5, 0, len(copies))
    return head + b"".join(LOCATION.pack(int(Status.SERVING), sidx, 0, lid, 7, 0) for sidx, lid in copies)


def _context(root: str) -> InstanceContext:
    nfs = FileBackend(StorageConfig.model_validate({"global_unique_name": "nfs_01", "nfs": {"root_path": root}}))
    three = ThreeFSBackend(
        StorageConfig.model_validate({"global_unique_name": "3fs_01", "threefs": {"mountpoint": root, "root_dir": "r"}})
    )
    route = {"source_storage_name": "nfs_01", "target_storage_name": "3fs_01"}
    group = InstanceGroup.model_validate({"name": "g", "cache_config": {"migration_config": {"strategies": [route]}}})
    specs = SpecLayout((LocationSpecInfo(name="tp0", size=16), LocationSpecInfo(name="tp1", size=32)), ())
    return InstanceContext(
        "i1", group, 4, specs, InstanceLayout("t", "i1", 4), (StorageState(nfs, True), StorageState(three, True))
    )


def main() -> None:
    ctx = _context(tempfile.mkdtemp())
    one = [_record((1, 9 + k)) for k in range(N)]
    two = [_record((2, 10 + k), (1, 9 + k)) for k in range(N)]

    def render(records: list[bytes], storage_type: StorageType | None = None) -> None:
        renderer = LocationRenderer(ctx, NAMES.get)
        for key, raw in enumerate(records):
            renderer.render(key, raw, storage_type=storage_type)

    assert LocationRenderer(ctx, NAMES.get).render(0, two[0]) == LocationRenderer(ctx, NAMES.get).render(0, one[0])
    times = timeit_interleaved(
        {
            "one": lambda: render(one),
            "two": lambda: render(two),
            "by_type": lambda: render(two, StorageType.ST_3FS),
        }
    )
    print(f"rendering {N} records (median of interleaved rounds):")
    print(row("baseline: one copy each (fast path)", times["one"]))
    print(row("two copies on two tiers: the tier choice", times["two"], times["one"]))
    print(row("two copies, one type asked (getCacheLocationsByBackend)", times["by_type"], times["one"]))


if __name__ == "__main__":
    main()
