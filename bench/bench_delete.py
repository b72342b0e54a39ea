"""Deletion throughput: blocks per second through the batched_delete state machine (the
real ASL in moto's interpreter, Lambda tasks dispatched in-process) on the file backend,
side by side with the same deletion run inline (no workflow) and with bare os.remove of
the same files (the floor).

    .venv/bin/python bench/bench_delete.py [blocks]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chalicelib.protocol.models import (
    BlockMask,
    FinishWriteCacheRequest,
    RegisterInstanceRequest,
    RemoveCacheRequest,
    StartWriteCacheRequest,
)
from chalicelib.runtime import get_runtime
from local_stack import LocalStack, StackConfig

BATCH = 128


def write(rt, instance: str, keys: list[int]) -> list[Path]:
    """Start + finish ``keys`` and create the files the URIs name (what engines do)."""
    paths = set()
    for i in range(0, len(keys), BATCH):
        start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id=instance, block_keys=keys[i : i + BATCH]))
        for loc in start.locations:
            for spec in loc["location_specs"]:
                path = Path(spec["uri"].split("?")[0][len("file://nfs_01") :])
                path.parent.mkdir(parents=True, exist_ok=True)
                paths.add(path)
        for path in paths:
            path.touch()
        rt.cache.finish_write_cache(
            FinishWriteCacheRequest(
                instance_id=instance,
                write_session_id=start.write_session_id,
                success_blocks=BlockMask(offset=len(start.locations)),
            )
        )
    return sorted(paths)


def register(rt, instance: str) -> None:
    rt.meta_service.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": "default",
                "instance_id": instance,
                "block_size": 16,
                "location_spec_infos": [{"name": "tp0", "size": 1 << 20}, {"name": "tp1", "size": 1 << 20}],
                "model_deployment": {"model_name": "m", "dtype": "bf16"},
            }
        )
    )


def main() -> None:
    blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    with tempfile.TemporaryDirectory() as state:
        config = replace(StackConfig.from_env(), state_dir=Path(state), port=0, aws_port=0, snapshot_period_s=0)
        with LocalStack(config):
            rt = get_runtime()
            print(f"deletion throughput, {blocks} two-spec blocks on the file backend (8 blocks per file)")

            register(rt, "bench-sfn")
            paths = write(rt, "bench-sfn", list(range(1, blocks + 1)))
            t0 = time.perf_counter()
            rt.cache.remove_cache(RemoveCacheRequest(instance_id="bench-sfn", block_keys=list(range(1, blocks + 1))))
            while any(p.exists() for p in paths[-8:]) or rt.index.usage([rt.contexts("bench-sfn").layout])[0].keys:
                time.sleep(0.02)
            sfn_s = time.perf_counter() - t0

            register(rt, "bench-inline")
            write(rt, "bench-inline", list(range(1, blocks + 1)))
            ctx = rt.contexts("bench-inline")
            t0 = time.perf_counter()
            victims = rt.index.mark_deleting(ctx.layout, list(range(1, blocks + 1)), ctx.spec_layout.sizes)
            for i in range(0, len(victims), 256):
                rt.deletion.delete(ctx, victims[i : i + 256])
            inline_s = time.perf_counter() - t0

            floor_paths = []
            for i in range(len(paths)):
                path = Path(state) / "floor" / f"{i:08d}"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
                floor_paths.append(path)
            t0 = time.perf_counter()
            for path in floor_paths:
                os.remove(path)
            floor_s = time.perf_counter() - t0

            print(f"  {'bare os.remove of the same files (floor)':<52} {blocks / floor_s:>12,.0f} blocks/s")
            inline_label = "KVCM deletion inline (claim, files, compare-and-delete)"
            print(f"  {inline_label:<52} {blocks / inline_s:>12,.0f} blocks/s")
            print(
                f"  {'KVCM removeCache -> batched_delete state machine':<52} {blocks / sfn_s:>12,.0f} blocks/s"
                f"  ({sfn_s:.2f} s end to end, including moto's Step Functions)"
            )


if __name__ == "__main__":
    main()
