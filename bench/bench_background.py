"""What the background rounds cost with many idle instances (issue 28.12: a reclaim round
went from 52 to 299 ms at 673 instances, idle CPU from 5.5 % to 27 % of a core).

With 10 and 700 instances registered in one group, each holding a few blocks and no
open write session (nothing to do), prints per round of each scheduled job: wall time,
Valkey commands and the control-table requests it made. Beside them, same run: a
pipelined read of every instance's usage hash (what a round that visits each instance
pays at least in Valkey).

    .venv/bin/python bench/bench_background.py [--counts 10,700]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import row, start_local_aws, valkey_server

SPECS = [{"name": "tp0", "size": 1024}]
ROUNDS = 5


def valkey_calls(client) -> int:
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config|resetstat"))


class ControlRequests:
    """Counts the control table's DynamoDB requests (botocore's before-call event)."""

    def __init__(self, dynamodb) -> None:
        self.count = 0
        dynamodb.meta.events.register("before-call.dynamodb", self._seen)

    def _seen(self, **_: object) -> None:
        self.count += 1


def measure(count: int, client, data_dir: str) -> dict[str, tuple[float, float, float]]:
    from chalicelib.clock import ManualClock
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
    clock = ManualClock()
    rt = Runtime(
        settings=Settings(node_id="bench", control_table=f"bg-{count}", config_refresh_s=3600),
        valkey=client,
        clock=clock,
    )
    set_runtime(rt)
    ensure_table(rt.aws("dynamodb"), rt.settings.control_table)
    rt.control.add_storage(
        StorageConfig.model_validate({"global_unique_name": "nfs_01", "nfs": {"root_path": data_dir}})
    )
    rt.control.create_group(
        InstanceGroup.model_validate({"name": "g", "storage_candidates": ["nfs_01"], "quota": {"capacity": 100 << 30}})
    )
    for i in range(count):
        request = {
            "instance_group": "g",
            "instance_id": f"i{i}",
            "block_size": 16,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "m", "dtype": "bf16"},
        }
        rt.meta_service.register_instance(RegisterInstanceRequest.model_validate(request))
        out = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id=f"i{i}", block_keys=[1, 2, 3]))
        rt.cache.finish_write_cache(
            FinishWriteCacheRequest(
                instance_id=f"i{i}", write_session_id=out.write_session_id, success_blocks=BlockMask(offset=3)
            )
        )
    control_requests = ControlRequests(rt.aws("dynamodb"))
    jobs: dict[str, Callable[[], object]] = {
        "reclaim": rt.reclaim_job.run,
        "write-session reaper": rt.session_reaper.expire_write_sessions,
        "usage metrics": rt.usage_metrics.run,
        "health check": rt.health_checks.run_health_checks,
    }
    layouts = [rt.contexts(f"i{i}").layout for i in range(count)]

    def read_every_usage() -> None:
        pipe = client.pipeline(transaction=False)
        for layout in layouts:
            pipe.hgetall(layout.key("u"))
        pipe.execute()

    jobs["baseline: pipelined HGETALL of every usage hash"] = read_every_usage
    out: dict[str, tuple[float, float, float]] = {}
    for name, job in jobs.items():
        job()  # warm: scripts loaded, caches filled
        walls = []
        client.config_resetstat()
        control_requests.count = 0
        for _ in range(ROUNDS):
            clock.advance(2)  # past the reaper's interval, not the listings' reuse
            t0 = time.perf_counter()
            job()
            walls.append(time.perf_counter() - t0)
        out[name] = (statistics.median(walls) * 1e3, valkey_calls(client) / ROUNDS, control_requests.count / ROUNDS)
        print(f"  [{count}] {name}: {out[name]}", file=sys.stderr, flush=True)
    set_runtime(None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="10,700")
    args = parser.parse_args()
    aws = start_local_aws()
    try:
        with valkey_server() as client, tempfile.TemporaryDirectory() as data_dir:
            for count in (int(c) for c in args.counts.split(",")):
                print(f"{count} idle instances in one group (median of {ROUNDS} rounds)")
                for name, (wall_ms, calls, requests) in measure(count, client, data_dir).items():
                    print(
                        row(name, wall_ms, unit="ms")
                        + f"  {calls:7.0f} Valkey commands  {requests:5.1f} table requests"
                    )
    finally:
        aws.stop()


if __name__ == "__main__":
    main()
