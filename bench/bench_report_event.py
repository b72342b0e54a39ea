"""reportEvent and getHostCacheState against the raw Valkey work they stand for.

(a) An ADD batch of 1,000 events of one reporter (2 specs each): the report script alone,
    and with the body's parsing and checks (decoding + item rules), beside a
    pipelined HSET of the same 1,000 records (the values the script stored in the
    reporter's records hash), each with Valkey's own time (INFO commandstats, CPU).
    Target: the script ≤ 2× the HSET pipeline, wall and Valkey CPU (the server's whole
    cost: commandstats leaves a pipeline's parsing and I/O out but holds all of a script's
    work, so its ratio overstates the script's cost). The script also keeps each key's
    reporter bitmap, a second hash write the baseline does not do.
(b) getHostCacheState for prompts of 1,000, 20,000 and 100,000 keys (one prompt and its
    prefixes) over 64 reporting hosts, one holding the whole prompt and each other a random
    prefix of its first 20,000 keys: through the local server (HTTP, the keys as decimal
    strings as proto3 JSON prints them) and the store alone (``ReporterStore.host_prefixes``:
    the reporters' script and the keys' HMGET in one transaction, the walk in Python), each
    with Valkey's time, and in-process (the API's dispatcher, as the Lambda handler runs it:
    the body's bytes in, the answer's text out), beside an HMGET of the same keys' bitmaps
    sent by redis-py on the same Valkey (reading what the walk reads without deciding
    anything). Also a prompt that no host holds past its 100th key (its first 100 keys, then
    keys nobody reported): the read stops early, in process and the store alone. Upstream's
    newest serial p50s: 1.12 ms (1k) and 8.5 ms (20k). The Mamba query (the same walk, the
    spec names coming from the slots) is printed too; upstream publishes no figure for it.
(c) The whole reportEvent call (the body's bytes in, the response's out: parsing, checks,
    script, response) at 1,000 and 20,000 new events per request, in-process (the API's
    dispatcher, as the Lambda handler runs it) and through the local server (HTTP on one
    keep-alive connection), beside a same-run pipelined HSET of the same records into the
    same Valkey: wall time, and CPU time (this process's, which holds the local server,
    plus Valkey's), which a loaded machine inflates less. Target (#25 item 1): at most
    10 µs per event. Upstream publishes 2.4–2.8 µs per event in 20,000-event requests
    (55.9 ms create, 48.2 ms update).
(d) A reporter's snapshot of 1,000 keys (500 it held, 500 new) on an instance holding
    1,000,000 reported keys (``--keys``; 8 other reporters hold the rest), then the
    reconciliation's cleanup (the 500 dropped records), then the reporter's death (past its
    heartbeat timeout and grace) and its cleanup (its 1,000 records): each beside the same
    steps on an instance holding only that reporter's keys, and beside a redis-py pipeline
    of the same writes (1,000 records and bitmaps set; 1,000 deleted and bitmaps
    rewritten). Cost O(the reporter's keys) shows as a ratio near 1 to the small instance.
    SCAN-family calls inside each step are counted from commandstats: the snapshot makes
    none; the cleanup walks the reporter's own hash only (HSCAN, 1,000 fields a call).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ValkeyTime, row, valkey_cpu_s, valkey_server
from chalicelib.cache.event_reports import encode_events
from chalicelib.protocol.codes import ErrorCode
from chalicelib.protocol.models import ReportEventRequest
from chalicelib.stores.reporters import (
    CLEANUP_BATCH,
    Liveness,
    ReporterStore,
    add_event,
    block_field,
    register_event,
    snapshot_event,
)

INSTANCE = "bench"
RID = "l1p5#10.0.0.1:8080"
LIVENESS = Liveness(heartbeat_timeout_ms=10**12, cleanup_grace_ms=10**12, snapshot_min_interval_ms=0)
#: What the dead reporter's expiry is judged by: silent past 1 ms of timeout and 1 ms of grace.
DEAD = Liveness(heartbeat_timeout_ms=1, cleanup_grace_ms=1, snapshot_min_interval_ms=0)
SNAPSHOT_KEYS = 1_000
#: Upstream's newest serial p50s (report_event_performance.md §5.8, 1,000 keys; 20,000 keys after
#: its §5.9, as issue 25 cites it): pure local metadata, Release build, real HTTP.
UPSTREAM_HOST_STATE_P50_MS = {1_000: 1.12, 20_000: 8.5}
#: Upstream's newest figures (docs/design/report_event_performance.md): µs per event in
#: 20,000-event requests, create and update.
UPSTREAM_WHOLE_CALL_US = (2.8, 2.4)


def add_body(keys: list[int], instance_id: str = INSTANCE) -> dict:
    """The reportEvent request of an ADD of ``keys``."""
    return {
        "instance_id": instance_id,
        "host_ip_port": "10.0.0.1:8080",
        "storage_type": "ST_EVENT_REPORT_L1P5",
        "events": [
            {
                "event_type": "EVENT_BLOCK_ADD",
                "block_add": {
                    "block_key": str(k),
                    "medium": "gpu",
                    "specs": [
                        {"name": "full_0", "uri": f"event_report://10.0.0.1:9600/gpu/{k}?size=4096"},
                        {"name": "linear_0", "uri": f"event_report://10.0.0.1:9600/gpu/{k}?size=1024"},
                    ],
                },
            }
            for k in keys
        ],
    }


def now_ms() -> int:
    return int(time.time() * 1000)


def events_for(keys: list[int]) -> list[list]:
    return [
        add_event(
            k,
            "gpu",
            [
                ("full_0", f"event_report://10.0.0.1:9600/gpu/{k}?size=4096"),
                ("linear_0", f"event_report://10.0.0.1:9600/gpu/{k}?size=1024"),
            ],
        )
        for k in keys
    ]


def bench_add(client, store: ReporterStore, timer: ValkeyTime, calls: int = 30, rounds: int = 6) -> None:
    """New blocks (every batch adds 1,000 keys not seen before: an engine's steady state) and
    re-adds (the same 1,000 keys again: merged into what is stored)."""
    records_key, bits_key = store.records_key(INSTANCE, RID), store.bits_key(INSTANCE)
    batches = [random.sample(range(1, 1 << 40), 1000) for _ in range(3 * calls + 1)]
    store.report(INSTANCE, RID, events_for(batches[0]), now_ms(), LIVENESS)
    value = client.hget(records_key, block_field(batches[0][0]))  # one key's record (the key is not in it)
    bitmap = client.hget(bits_key, block_field(batches[0][0]))  # and its bitmap
    hset_fresh = iter(batches[calls + 1 : 2 * calls + 1])
    both_fresh = iter(batches[2 * calls + 1 :])
    readd = events_for(batches[0])
    raw = json.dumps(add_body(batches[0])).encode()

    def hset_pipeline(keys, with_bitmaps=False):
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.hset(records_key, block_field(k), value)
            if with_bitmaps:
                pipe.hset(bits_key, block_field(k), bitmap)
        pipe.execute()

    def with_checks():
        request = ReportEventRequest.from_body(raw)
        _, encoded = encode_events(request.events)
        store.report(INSTANCE, RID, encoded, now_ms(), LIVENESS)

    new_iter = iter([events_for(keys) for keys in batches[1 : calls + 1]])
    cases = {
        "hset new": lambda: hset_pipeline(next(hset_fresh)),
        "script new": lambda: store.report(INSTANCE, RID, next(new_iter), now_ms(), LIVENESS),
        "both new": lambda: hset_pipeline(next(both_fresh), with_bitmaps=True),
        "hset again": lambda: hset_pipeline(batches[0]),
        "script again": lambda: store.report(INSTANCE, RID, readd, now_ms(), LIVENESS),
        "both again": lambda: hset_pipeline(batches[0], with_bitmaps=True),
        "checks again": with_checks,
    }
    # The cases take turns, a few calls each, so that a stretch of load on the machine
    # weighs on every case alike; each figure is the median over the turns.
    turns: dict[str, list[tuple[float, float, float]]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            turns[name].append(timer.measure(fn, calls // rounds))
    figures = {name: tuple(statistics.median(t[i] for t in runs) for i in range(3)) for name, runs in turns.items()}
    print("(a) ADD batch of 1,000 events (2 specs each), ms per batch: wall / Valkey commandstats / Valkey CPU")
    for case, label in (("new", "new blocks"), ("again", "the same blocks again")):
        base, both, ours = figures[f"hset {case}"], figures[f"both {case}"], figures[f"script {case}"]
        for i, name in enumerate(("wall", "commandstats", "CPU")):
            print(row(f"{label}: pipelined HSET of the records, {name}", base[i] / 1000, unit="ms"))
            print(
                row(f"{label}: pipelined HSET of records + bitmaps, {name}", both[i] / 1000, base[i] / 1000, unit="ms")
            )
            print(row(f"{label}: report script, {name}", ours[i] / 1000, base[i] / 1000, unit="ms"))
    wall = figures["checks again"][0]
    print(
        row(
            "the body's parsing + item checks + script (same blocks), wall",
            wall / 1000,
            figures["hset again"][0] / 1000,
            unit="ms",
        )
    )
    create, update = UPSTREAM_WHOLE_CALL_US  # µs per event = ms per 1,000 events
    print(f"  upstream's newest whole call, per 1,000 events (in 20,000-event requests): {update}–{create} ms")


HOST_STATE_SIZES = (1_000, 20_000, 100_000)
#: The longest prefix other than the whole prompt's: the hosts' records stay a few hundred MB.
HOST_STATE_OTHERS_MAX = 20_000


def host_state_fill(store: ReporterStore, instance: str, keys: list[int], hosts: int) -> dict[str, int]:
    """Host 0 holds the whole prompt, each other host a random prefix of its first 20,000
    keys: host -> its prefix length."""
    rng = random.Random(len(keys))
    expected = {}
    for h in range(hosts):
        rid = f"l1p5#10.0.1.{h}:8080"
        held = keys if h == 0 else keys[: rng.randint(1, min(len(keys), HOST_STATE_OTHERS_MAX))]
        expected[rid.partition("#")[2]] = len(held)
        for start in range(0, len(held), 5000):
            events = [
                add_event(k, "gpu", [("full_0", f"event_report://10.0.1.{h}/{k}")]) for k in held[start : start + 5000]
            ]
            store.report(instance, rid, events, now_ms(), LIVENESS)
    return expected


def bench_host_state(hosts: int = 64) -> None:
    """getHostCacheState through the local server (HTTP, JSON in and out), in process,
    the store alone and Valkey's time, beside an HMGET of the same keys' bitmaps
    from Python on the same Valkey, for prompts of 1,000 / 20,000 / 100,000 keys (one
    prompt, its prefixes): the cases take turns, each figure is the median of its calls."""
    import redis

    from bench.bench_live import Connector
    from bench.bench_relay import setup
    from local_stack import LocalStack
    from local_stack.config import StackConfig

    print(
        f"(b) getHostCacheState over {hosts} reporting hosts (one holds the whole prompt, each other a random"
        f" prefix of its first {HOST_STATE_OTHERS_MAX:,} keys), through the local server"
    )
    quiet_access_log()
    # A 100,000-key walk on a loaded 2-core machine can outlast the 1 s default.
    os.environ.setdefault("KVCM_VALKEY_SOCKET_TIMEOUT_S", "10")
    with tempfile.TemporaryDirectory() as state:
        config = StackConfig(state_dir=Path(state), port=0, aws_port=0, snapshot_period_s=0)
        with LocalStack(config) as stack:
            api = Connector(stack.api_url)
            setup(api)
            client = redis.Redis.from_url(stack.valkey_url)
            store = ReporterStore(client)
            timer = ValkeyTime(client)
            prompt = random.sample(range(1, 1 << 62), max(HOST_STATE_SIZES))
            t0 = time.perf_counter()
            expected = host_state_fill(store, "bench", prompt, hosts)
            print(f"  filled {sum(expected.values()):,} records in {time.perf_counter() - t0:.0f} s")
            in_process = InProcess()
            for n in HOST_STATE_SIZES:
                want = {host: min(p, n) for host, p in expected.items()}
                host_state_case(api, in_process, store, timer, prompt[:n], want)


def quiet_access_log() -> None:
    """The access lines (one a call) to /dev/null: a terminal's writes are no cost of the call."""
    from chalicelib.observability.logging import logger

    logger.registered_handler.setStream(open(os.devnull, "w"))


def answered(resp: dict) -> dict:
    assert resp["header"]["status"]["code"] == "OK", resp["header"]
    return resp


class InProcess:
    """Calls through the API's dispatcher, as the Lambda handler runs it: the body's bytes
    in, the response's text out (parsing, checks, script, rendering), no HTTP."""

    def __init__(self) -> None:
        from chalicelib.routes.dispatch import Dispatcher
        from chalicelib.routes.meta import OPERATIONS
        from chalicelib.runtime import get_runtime

        self.dispatcher, self.runtime = Dispatcher(OPERATIONS), get_runtime()

    def call(self, method: str, raw: bytes) -> str:
        status, text = self.dispatcher.handle(self.runtime, method, raw, {})
        assert status == 200 and '"code":"OK"' in text, text[:300]
        return text


def host_state_case(
    api, in_process: InProcess, store: ReporterStore, timer: ValkeyTime, keys: list[int], want: dict[str, int]
) -> None:
    """One prompt's figures: the cases take turns (3 calls a turn), each the median turn."""
    n, client = len(keys), store.client
    timeouts = {"l1p5": LIVENESS.heartbeat_timeout_ms}
    mamba = (["full_0"], ["full_0"])  # the same answer as the plain prefix, through Mamba's walk
    # The keys as decimal strings, as proto3 JSON prints int64 (upstream's clients send them so).
    body = {"instance_id": "bench", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": list(map(str, keys))}
    answer = api.call("getHostCacheState", body)
    assert {h["host_ip_port"]: int(h["local"]) for h in answer["hosts"]} == want, answer["header"]
    raw = json.dumps(body).encode()
    assert json.loads(in_process.call("getHostCacheState", raw))["hosts"] == answer["hosts"]
    assert store.host_prefixes("bench", keys, now_ms(), timeouts) == want
    assert store.host_prefixes("bench", keys, now_ms(), timeouts, mamba=mamba) == want
    bits_key, fields = store.bits_key("bench"), [block_field(k) for k in keys]
    # Held to key 100 (the hosts holding more are cut there), then keys nobody reported.
    short = keys[:100] + random.Random(n).sample(range(-(1 << 62), 0), n - 100)
    short_raw = json.dumps({**body, "block_cache_keys": list(map(str, short))}).encode()
    assert store.host_prefixes("bench", short, now_ms(), timeouts) == {h: min(p, 100) for h, p in want.items()}
    cases = {
        "HMGET of the keys' bitmaps from Python (baseline)": lambda: client.hmget(bits_key, fields),
        "through the local server (HTTP, JSON)": lambda: answered(api.call("getHostCacheState", body)),
        "in-process (the dispatcher: body bytes in, JSON text out)": lambda: in_process.call("getHostCacheState", raw),
        "the store alone (ReporterStore.host_prefixes)": lambda: store.host_prefixes("bench", keys, now_ms(), timeouts),
        "the store alone, Mamba": lambda: store.host_prefixes("bench", keys, now_ms(), timeouts, mamba=mamba),
        "in-process, nobody holding past key 100": lambda: in_process.call("getHostCacheState", short_raw),
        "the store alone, nobody holding past key 100": lambda: store.host_prefixes("bench", short, now_ms(), timeouts),
    }
    turns: dict[str, list[tuple[float, float, float]]] = {name: [] for name in cases}
    for _ in range(10 if n <= 20_000 else 4):
        for name, fn in cases.items():
            turns[name].append(timer.measure(fn, 3))
    baseline = None
    for name, runs in turns.items():
        wall, server, cpu = (statistics.median(r[i] / 1000 for r in runs) for i in range(3))
        print(row(f"{n:>7,} keys: {name}, median", wall, baseline, unit="ms"))
        print(f"{'':>9}Valkey: commandstats {server:.2f} ms, CPU {cpu:.2f} ms")
        baseline = baseline or wall
    if n in UPSTREAM_HOST_STATE_P50_MS:
        print(row(f"{n:>7,} keys: upstream's newest published p50", UPSTREAM_HOST_STATE_P50_MS[n], unit="ms"))


def specs_of(host: str, key: int) -> list[tuple[str, str]]:
    return [("full_0", f"event_report://{host}/gpu/{key}")]


def fill(store: ReporterStore, instance: str, rid: str, keys: list[int], batch: int = 5_000) -> None:
    """Report ``keys`` for ``rid`` through the reporter's own API, ``batch`` ADDs a call."""
    host = rid.partition("#")[2]
    for start in range(0, len(keys), batch):
        events = [add_event(k, "gpu", specs_of(host, k)) for k in keys[start : start + batch]]
        outcome = store.report(instance, rid, events, now_ms(), LIVENESS)
        assert set(outcome.codes) == {ErrorCode.OK}, outcome.codes[:3]


def scans(client) -> int:
    """SCAN-family calls since the last CONFIG RESETSTAT (inner script commands included)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("scan", "hscan", "sscan", "zscan"))


class ReporterLife:
    """One round of the reporter's life on one instance: keys reported, a snapshot, the
    reconciliation's cleanup, death and the dead reporter's cleanup; each step timed."""

    def __init__(self, client, store: ReporterStore, timer: ValkeyTime, instance: str) -> None:
        self.client, self.store, self.timer, self.instance = client, store, timer, instance
        self.rid = "l1p5#10.0.9.9:8080"
        self.host = self.rid.partition("#")[2]
        self.steps: dict[str, list[tuple[float, float, float]]] = {}
        self.scans: dict[str, int] = {}

    def _step(self, name: str, fn) -> object:
        out: list[object] = []
        self.client.config_resetstat()
        figures = self.timer.measure(lambda: out.append(fn()), 1)
        self.scans[name] = max(self.scans.get(name, 0), scans(self.client))
        self.steps.setdefault(name, []).append(figures)
        return out[0]

    def round(self) -> None:
        store, instance, rid = self.store, self.instance, self.rid
        store.report(instance, rid, [register_event(["gpu"])], now_ms(), LIVENESS)
        held = random.sample(range(1 << 41, 1 << 42), SNAPSHOT_KEYS)
        fill(store, instance, rid, held)
        blocks = [(k, "gpu", specs_of(self.host, k)) for k in held[: SNAPSHOT_KEYS // 2]]
        blocks += [
            (k, "gpu", specs_of(self.host, k)) for k in random.sample(range(1 << 42, 1 << 43), SNAPSHOT_KEYS // 2)
        ]
        outcome = self._step(
            "snapshot", lambda: store.report(instance, rid, [snapshot_event(blocks)], now_ms(), LIVENESS)
        )
        assert outcome.codes == [ErrorCode.OK] and outcome.retired, outcome
        removed = self._step("reconciliation cleanup", lambda: store.cleanup(instance, rid, outcome.retired))
        assert removed == SNAPSHOT_KEYS // 2, removed
        later = now_ms() + 10_000
        dead = self._step("death (expiry past the grace)", lambda: store.expire(instance, rid, later, DEAD))
        assert dead.retired, dead
        removed = self._step("dead reporter's cleanup", lambda: store.cleanup(instance, rid, dead.retired))
        assert removed == SNAPSHOT_KEYS, removed

    def median(self, name: str) -> tuple[float, ...]:
        runs = self.steps[name]
        return tuple(statistics.median(r[i] for r in runs) for i in range(3))


def pipeline_baselines(client, store: ReporterStore, timer: ValkeyTime, instance: str, rounds: int) -> dict:
    """The same writes as a redis-py pipeline, into scratch hashes of the instance's slot:
    1,000 records and bitmaps set (a snapshot's), then deleted with the bitmaps rewritten
    (a cleanup's); records and bitmaps of the instance's own."""
    rid = "l1p5#10.0.0.0:8080"
    records, bits = store.records_key(instance, rid), store.bits_key(instance)
    field, record = next(client.hscan_iter(records, count=1000))
    bitmap = client.hget(bits, field)
    scratch_records, scratch_bits = store.records_key(instance, "scratch"), bits + ":scratch"
    runs: dict[str, list[tuple[float, float, float]]] = {"set": [], "delete": []}
    for _ in range(rounds):
        fields = [block_field(k) for k in random.sample(range(1 << 43, 1 << 44), SNAPSHOT_KEYS)]

        def set_all(fields=fields):
            pipe = client.pipeline(transaction=False)
            for f in fields:
                pipe.hset(scratch_records, f, record)
                pipe.hset(scratch_bits, f, bitmap)
            pipe.execute()

        def delete_all(fields=fields):
            pipe = client.pipeline(transaction=False)
            for f in fields:
                pipe.hdel(scratch_records, f)
                pipe.hset(scratch_bits, f, b"")
            pipe.execute()

        runs["set"].append(timer.measure(set_all, 1))
        runs["delete"].append(timer.measure(delete_all, 1))
    client.delete(scratch_records, scratch_bits)
    return {name: tuple(statistics.median(r[i] for r in rs) for i in range(3)) for name, rs in runs.items()}


def bench_snapshot(client, store: ReporterStore, timer: ValkeyTime, keys: int, rounds: int = 9) -> None:
    big, small = "snap_big", "snap_small"
    others = keys - SNAPSHOT_KEYS
    t0 = time.perf_counter()
    pool = random.sample(range(1, 1 << 40), others)
    for r in range(8):
        fill(store, big, f"l1p5#10.0.0.{r}:8080", pool[r::8])
    fill_s = time.perf_counter() - t0
    lives = {big: ReporterLife(client, store, timer, big), small: ReporterLife(client, store, timer, small)}
    for _ in range(rounds):  # the instances take turns, so that load on the machine weighs on both
        for life in lives.values():
            life.round()
    base = pipeline_baselines(client, store, timer, big, rounds)
    held = client.hlen(store.bits_key(big)) + SNAPSHOT_KEYS  # the reporter's keys are back each round
    print(
        f"(d) a reporter's snapshot of {SNAPSHOT_KEYS:,} keys on an instance holding {held:,} reported keys"
        f" (filled in {fill_s:.0f} s), median of {rounds} rounds, ms"
    )
    print(
        f"  {'step':<31} {'figure':<13} {'alone (' + format(SNAPSHOT_KEYS, ',') + ' keys)':>20}"
        f" {format(held, ',') + ' keys (× alone)':>26} {'pipeline (× it)':>22}  SCANs"
    )
    for step, baseline in (
        ("snapshot", "set"),
        ("reconciliation cleanup", "delete"),
        ("death (expiry past the grace)", None),
        ("dead reporter's cleanup", "delete"),
    ):
        ours, alone = lives[big].median(step), lives[small].median(step)
        for i, name in enumerate(("wall", "commandstats", "Valkey CPU")):
            pipe = f"{base[baseline][i] / 1000:>9.1f} ({ours[i] / base[baseline][i]:5.2f}×)" if baseline else ""
            print(
                f"  {step if i == 0 else '':<31} {name:<13} {alone[i] / 1000:>20.1f}"
                f" {ours[i] / 1000:>17.1f} ({ours[i] / alone[i]:5.2f}×) {pipe:>22}"
                f"  {lives[big].scans[step] if i == 0 else ''}"
            )
    print("  pipeline: 'snapshot' against 1,000 records + bitmaps set; the cleanups against 1,000 deleted, bitmaps set")
    t0 = time.perf_counter()
    walked = sum(1 for _ in client.hscan_iter(store.bits_key(big), count=CLEANUP_BATCH, no_values=True))
    print(
        f"  for scale, a diff by scan's read: HSCAN of the instance's bitmap hash ({walked:,} keys),"
        f" {(time.perf_counter() - t0) * 1000:.0f} ms"
    )


def _stack_setup(stack) -> None:
    """An event-report storage, a group using it, instance ``bench`` (bench_relay's)."""
    from bench.bench_live import Connector
    from bench.bench_relay import setup

    setup(Connector(stack.api_url))


def bench_whole_call(sizes: tuple[int, ...] = (1_000, 20_000), rounds: int = 5) -> None:
    """(c): the whole call in-process and through the local server, beside the HSET pipeline."""
    import redis

    from local_stack import LocalStack
    from local_stack.config import StackConfig

    print("(c) the whole reportEvent call, new blocks (2 specs each), ms per request and µs per event")
    quiet_access_log()
    # A loaded machine may hold a 20,000-event script past the request path's 1 s socket
    # timeout; this bench measures the time, not that timeout.
    os.environ.setdefault("KVCM_VALKEY_SOCKET_TIMEOUT_S", "30")
    with (
        tempfile.TemporaryDirectory() as state,
        LocalStack(StackConfig(state_dir=Path(state), port=0, aws_port=0, snapshot_period_s=0)) as stack,
    ):
        _stack_setup(stack)
        client = redis.Redis.from_url(stack.valkey_url)
        store = ReporterStore(client)
        dispatcher = InProcess()
        conn = http.client.HTTPConnection("127.0.0.1", int(stack.api_url.rsplit(":", 1)[1]), timeout=120)
        register = {
            **add_body([], "bench"),
            "events": [{"event_type": "EVENT_NODE_REGISTER", "node_register": {"mediums": ["gpu"]}}],
        }
        fresh = iter(range(1, 1 << 62, 1 << 20))  # disjoint key ranges, one per request

        def body_of(n: int) -> bytes:
            start = next(fresh)
            return json.dumps(add_body(list(range(start, start + n)), "bench")).encode()

        def in_process(raw: bytes) -> None:
            dispatcher.call("reportEvent", raw)

        def over_http(raw: bytes) -> None:
            conn.request("POST", "/api/reportEvent", body=raw, headers={"Content-Type": "application/json"})
            text = conn.getresponse().read()
            assert b'"code":"OK"' in text, text[:300]

        in_process(json.dumps(register).encode())
        rid = "l1p5#10.0.0.1:8080"
        records = store.records_key("bench", rid)
        for n in sizes:
            in_process(body_of(n))
            value = client.hget(records, block_field(1))

            def hset_pipeline(raw: bytes, n: int = n, value: bytes = value) -> None:
                start = next(fresh)
                pipe = client.pipeline(transaction=False)
                for k in range(start, start + n):
                    pipe.hset(records, block_field(k), value)
                pipe.execute()

            cases = {
                "pipelined HSET of the records (baseline)": hset_pipeline,
                "in-process": in_process,
                "local server": over_http,
            }
            # (wall s, CPU s of this process (client, local server) + Valkey's) per call
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
            for _ in range(rounds):  # in turns, so that the machine's load weighs on each alike
                for name, fn in cases.items():
                    raw = body_of(n)
                    valkey_before, cpu_before, began = valkey_cpu_s(client), time.process_time(), time.perf_counter()
                    fn(raw)
                    wall, cpu = time.perf_counter() - began, time.process_time() - cpu_before
                    samples[name].append((wall, cpu + valkey_cpu_s(client) - valkey_before))
            base = base_cpu = None
            for name, runs in samples.items():
                ms, cpu_ms = (statistics.median(run[i] for run in runs) * 1e3 for i in (0, 1))
                print(row(f"{n:>6} events: {name}, wall", ms, base, unit="ms") + f"  {ms * 1e3 / n:.1f} µs per event")
                print(
                    row(f"{n:>6} events: {name}, CPU (Python + Valkey)", cpu_ms, base_cpu, unit="ms")
                    + f"  {cpu_ms * 1e3 / n:.1f} µs per event"
                )
                base, base_cpu = base or ms, base_cpu or cpu_ms
        create, update = UPSTREAM_WHOLE_CALL_US
        print(f"upstream's published whole call, 20,000 events: {create} µs per event (create), {update} (update)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000, help="(d): reported keys the instance holds")
    parser.add_argument("--only", choices=("a", "b", "c", "d"), help="run one part only")
    args = parser.parse_args()
    sections = {args.only} if args.only else {"a", "b", "c", "d"}
    if sections & {"a", "d"}:
        with valkey_server() as client:
            store = ReporterStore(client)
            timer = ValkeyTime(client)
            if "a" in sections:
                bench_add(client, store, timer)
            if "d" in sections:
                bench_snapshot(client, store, timer, args.keys)
    if "b" in sections:
        bench_host_state()
    if "c" in sections:
        bench_whole_call()


if __name__ == "__main__":
    main()
