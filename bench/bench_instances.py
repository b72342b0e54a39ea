"""Background and start cost against the number of instances in a group.

With 10, 100 and 1,000 instances registered in one group (each holding a few blocks, the
group over no watermark), prints:

- one reclaim round (``ReclaimJob.run``: the group's look, the lost-deletion recovery,
  the counter reconciliation when due): wall time, Valkey round trips and Valkey time;
- startWriteCache of 16 new keys in one instance of the group, through the handler: p50
  wall time and Valkey time per call — beside a bare pipelined HSET of 16 keys measured
  in the same run.

Both must stay flat from 10 to 1,000 instances (issue 9: a round took 1.08 s and a start's
p50 went from 1.9 to 16 ms with 660 instances, reading every peer's usage).

    .venv/bin/python bench/bench_instances.py [--counts 10,100,1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import row, start_local_aws, valkey_server

SPECS = [{"name": "tp0", "size": 1024}, {"name": "tp1", "size": 1024}]
KEYS_PER_START = 16
STARTS = 200


def valkey_time_us(client) -> float:
    stats = client.info("commandstats")
    return sum(v["usec"] for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config|resetstat"))


def measure(count: int, client, data_dir: str) -> dict:
    from chalicelib.control import ensure_table
    from chalicelib.protocol.models import (
        BlockMask,
        FinishWriteCacheRequest,
        InstanceGroup,
        RegisterInstanceRequest,
        StartWriteCacheRequest,
        StorageConfig,
    )
    from chalicelib.runtime import Runtime, set_runtime
    from chalicelib.settings import Settings

    client.flushall()
    rt = Runtime(settings=Settings(config_refresh_s=3600, node_id="bench", control_table=f"ctl-{count}"), valkey=client)
    set_runtime(rt)
    ensure_table(rt.aws("dynamodb"), rt.settings.control_table)
    rt.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": data_dir, "key_count_per_file": 8}}
        )
    )
    rt.control.create_group(
        InstanceGroup.model_validate({"name": "g", "storage_candidates": ["nfs_01"], "quota": {"capacity": 100 << 30}})
    )
    for i in range(count):
        rt.meta_service.register_instance(
            RegisterInstanceRequest.model_validate(
                {
                    "instance_group": "g",
                    "instance_id": f"i{i}",
                    "block_size": 16,
                    "location_spec_infos": SPECS,
                    "model_deployment": {"model_name": "m", "dtype": "bf16"},
                }
            )
        )

    def start(instance: str, keys: list[int]):
        out = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id=instance, block_keys=keys))
        rt.cache.finish_write_cache(
            FinishWriteCacheRequest(
                instance_id=instance,
                write_session_id=out.write_session_id,
                success_blocks=BlockMask(offset=len(out.locations)),
            )
        )

    for i in range(count):
        start(f"i{i}", [i * 1000 + k for k in range(1, 4)])
    rt.reclaim_job.run()  # warm: scripts loaded, listing cached
    rounds = []
    client.config_resetstat()
    for _ in range(5):
        t0 = time.perf_counter()
        rt.reclaim_job.run()
        rounds.append(time.perf_counter() - t0)
    round_valkey = valkey_time_us(client) / 5
    samples = []
    client.config_resetstat()
    for n in range(STARTS):
        keys = [10**9 + n * KEYS_PER_START + k for k in range(KEYS_PER_START)]
        t0 = time.perf_counter()
        rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="i0", block_keys=keys))
        samples.append(time.perf_counter() - t0)
    start_valkey = valkey_time_us(client) / STARTS

    pipe_samples = []
    for n in range(STARTS):
        pipe = client.pipeline(transaction=False)
        for k in range(KEYS_PER_START):
            pipe.hset(f"bare:{n % 8}", str(k), b"x" * 39)
        t0 = time.perf_counter()
        pipe.execute()
        pipe_samples.append(time.perf_counter() - t0)
    set_runtime(None)
    return {
        "round_ms": statistics.median(rounds) * 1000,
        "round_valkey_us": round_valkey,
        "start_us": statistics.median(samples) * 1e6,
        "start_valkey_us": start_valkey,
        "pipeline_us": statistics.median(pipe_samples) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="10,100,1000")
    args = parser.parse_args()
    aws = start_local_aws()
    try:
        with valkey_server() as client, tempfile.TemporaryDirectory() as data_dir:
            for count in (int(c) for c in args.counts.split(",")):
                result = measure(count, client, data_dir)
                print(f"{count} instances in the group")
                print(row("reclaim round (wall)", result["round_ms"], unit="ms"))
                print(row("reclaim round (Valkey time)", result["round_valkey_us"]))
                print(
                    row(
                        f"startWriteCache of {KEYS_PER_START} keys, p50 (wall)",
                        result["start_us"],
                        result["pipeline_us"],
                    )
                )
                print(row("startWriteCache (Valkey time per call)", result["start_valkey_us"]))
                print(row(f"baseline: pipelined HSET of {KEYS_PER_START} keys, p50", result["pipeline_us"]))
    finally:
        aws.stop()


if __name__ == "__main__":
    main()
