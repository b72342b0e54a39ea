"""reportEvent and getHostCacheState against the raw Valkey work they stand for.

(a) An ADD batch of 1,000 events of one reporter (2 specs each): the report script alone,
    and with the request's parsing and checks (pydantic model + item rules), beside a
    pipelined HSET of the same 1,000 records (the values the script stored), each with
    Valkey's own time (INFO commandstats, CPU). Target: the script ≤ 2× the HSET
    pipeline. Upstream publishes 63 ms per 1,000 events (Redis meta backend).
(b) getHostCacheState p50 for 1k- and 20k-key prompts over 64 reporting hosts, each
    holding a random prefix of the prompt, beside an HMGET of the same keys (reading them
    without deciding anything). Upstream publishes p50 1.8 ms (1k) and 26 ms (20k).
"""
from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ValkeyTime, row, valkey_server  # noqa: E402
from chalicelib.cache.event_reports import encode_events  # noqa: E402
from chalicelib.stores.reporters import Liveness, ReporterStore, add_event  # noqa: E402
from chalicelib.protocol.models import ReportEventRequest  # noqa: E402
from chalicelib.protocol.wire import parse_model  # noqa: E402

INSTANCE = "bench"
RID = "l1p5#10.0.0.1:8080"
LIVENESS = Liveness(heartbeat_timeout_ms=10**12, cleanup_grace_ms=10**12, snapshot_min_interval_ms=0)
UPSTREAM_ADD_MS_PER_1000 = 63.0
UPSTREAM_HOST_STATE_P50_MS = {1_000: 1.8, 20_000: 26.0}


def add_body(keys: list[int]) -> dict:
    """The reportEvent request of an ADD of ``keys``."""
    return {"instance_id": INSTANCE, "host_ip_port": "10.0.0.1:8080", "storage_type": "ST_EVENT_REPORT_L1P5",
            "events": [{"event_type": "EVENT_BLOCK_ADD", "block_add": {
                "block_key": str(k), "medium": "gpu",
                "specs": [{"name": "full_0", "uri": f"event_report://10.0.0.1:9600/gpu/{k}?size=4096"},
                          {"name": "linear_0", "uri": f"event_report://10.0.0.1:9600/gpu/{k}?size=1024"}]}}
                for k in keys]}


def now_ms() -> int:
    return int(time.time() * 1000)


def events_for(keys: list[int]) -> list[list]:
    return [add_event(k, "gpu", [("full_0", f"event_report://10.0.0.1:9600/gpu/{k}?size=4096"),
                                 ("linear_0", f"event_report://10.0.0.1:9600/gpu/{k}?size=1024")]) for k in keys]


def bench_add(client, store: ReporterStore, timer: ValkeyTime, calls: int = 30) -> None:
    """New blocks (every batch adds 1,000 keys not seen before: an engine's steady state) and
    re-adds (the same 1,000 keys again: merged into what is stored)."""
    loc_key = store.locations_key(INSTANCE)
    batches = [random.sample(range(1, 1 << 40), 1000) for _ in range(2 * calls + 1)]
    store.report(INSTANCE, RID, events_for(batches[0]), now_ms(), LIVENESS)
    value = client.hget(loc_key, str(batches[0][0]))  # what one key's record is (the key is not in it)
    hset_fresh = iter(batches[calls + 1:])
    readd = events_for(batches[0])
    body = add_body(batches[0])

    def hset_pipeline(keys):
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.hset(loc_key, str(k), value)
        pipe.execute()

    def with_checks():
        request = parse_model(ReportEventRequest, body)
        _, encoded = encode_events(request.events)
        store.report(INSTANCE, RID, encoded, now_ms(), LIVENESS)

    new_events = [events_for(keys) for keys in batches[1:calls + 1]]
    new_iter = iter(new_events)
    figures = {
        "hset new": timer.measure(lambda: hset_pipeline(next(hset_fresh)), calls),
        "script new": timer.measure(lambda: store.report(INSTANCE, RID, next(new_iter), now_ms(), LIVENESS), calls),
        "hset again": timer.measure(lambda: hset_pipeline(batches[0]), calls),
        "script again": timer.measure(lambda: store.report(INSTANCE, RID, readd, now_ms(), LIVENESS), calls),
        "checks again": timer.measure(with_checks, calls),
    }
    print("(a) ADD batch of 1,000 events (2 specs each), ms per batch: wall / Valkey commandstats / Valkey CPU")
    for case, label in (("new", "new blocks"), ("again", "the same blocks again")):
        base = figures[f"hset {case}"]
        ours = figures[f"script {case}"]
        for name, ours_v, base_v in zip(("wall", "commandstats", "CPU"), ours, base):
            print(row(f"{label}: pipelined HSET of the records, {name}", base_v / 1000, unit="ms"))
            print(row(f"{label}: report script, {name}", ours_v / 1000, base_v / 1000, unit="ms"))
    wall = figures["checks again"][0]
    print(row("request parsing + item checks + script (same blocks), wall", wall / 1000,
              figures["hset again"][0] / 1000, unit="ms"))
    print(row("upstream's published figure (Redis), per 1,000 events", UPSTREAM_ADD_MS_PER_1000, unit="ms"))


def p50_ms(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def bench_host_state(client, store: ReporterStore, hosts: int = 64) -> None:
    print(f"(b) getHostCacheState over {hosts} reporting hosts, each holding a random prefix of the prompt")
    for n in (1_000, 20_000):
        instance = f"hs{n}"
        client.delete(store.locations_key(instance))
        keys = random.sample(range(1, 1 << 40), n)
        rng = random.Random(n)
        for h in range(hosts):
            rid = f"l1p5#10.0.1.{h}:8080"
            held = keys[:rng.randint(1, n)]
            for start in range(0, len(held), 2000):
                store.report(instance, rid, [add_event(k, "gpu", [("full_0", f"event_report://10.0.1.{h}/{k}")])
                                             for k in held[start:start + 2000]], now_ms(), LIVENESS)
        timeouts = {"l1p5": LIVENESS.heartbeat_timeout_ms}
        answer = store.host_prefixes(instance, keys, now_ms(), timeouts)
        assert len(answer) == hosts, len(answer)
        loc_key = store.locations_key(instance)
        repeat = 50 if n <= 1_000 else 10
        baseline = p50_ms(lambda: client.hmget(loc_key, keys), repeat)
        ours = p50_ms(lambda: store.host_prefixes(instance, keys, now_ms(), timeouts), repeat)
        print(row(f"{n:>6} keys: HMGET of the keys (baseline)", baseline, unit="ms"))
        print(row(f"{n:>6} keys: host prefixes (ReporterStore.host_prefixes) p50", ours, baseline, unit="ms"))
        print(row(f"{n:>6} keys: upstream's published p50", UPSTREAM_HOST_STATE_P50_MS[n], unit="ms"))


def main() -> None:
    with valkey_server() as client:
        store = ReporterStore(client)
        timer = ValkeyTime(client)
        bench_add(client, store, timer)
        bench_host_state(client, store)


if __name__ == "__main__":
    main()
