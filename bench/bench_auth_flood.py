"""A legitimate tenant's latency under an anonymous flood and control churn (issue 28.1-28.3).

One container (one Runtime, the real dispatcher, auth on, the production config refresh
of 2 s) on moto + Valkey, with a manual clock: every call of tenant A moves it 5 ms and
the other loads run at their rates in that time, so each scenario sees as many config
refreshes and limiter windows per call of tenant A, however slow moto is on this machine.
Tenant A's engine calls getInstanceInfo and getCacheLocation in a loop with its API key,
from its own address. Beside it, in turn:

- idle: nothing else (the same-run baseline);
- flood: random ``kvcm_<id>.<secret>`` bearers at a bounded rate from 20 addresses, past
  every per-source and node-wide limiter bound, and password guesses at the admin from 20
  others;
- churn: tenant B's engine registering instances in its own group (through this
  container: every write moves the epoch) and another container adding accounts;
- both at once.

The other callers' requests are served between tenant A's, in the same thread, as one
Lambda container serves one request at a time: tenant A's latency shows what their
traffic does to the state it relies on (limiters, cached records), not CPU contention
of this process (moto's own latency is in every figure alike). Printed: tenant A's p50
and p99 per scenario, beside idle's, how many of its calls were refused (must be 0), and
how many other requests were served. Before issue 28 the flood then one registration got
tenant A 429 on every call; churn dropped every cached record of every tenant on each
write.

    .venv/bin/python bench/bench_auth_flood.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import start_local_aws, valkey_server

PASSWORD = "bench-admin-pass-word"
#: Tenant A's calls per second of the runtime's clock; the other loads are per second of it too.
LEGIT_PER_S = 200
FLOOD_PER_S = 100
GUESSES_PER_S = 2
REGISTRATIONS_PER_S = 2.4
ACCOUNTS_PER_S = 1.0
#: The flood's and the guesser's addresses (each): together past the node-wide bounds.
ADDRESSES = 20


def build(client):
    from chalicelib.clock import ManualClock

    aws = start_local_aws()
    from chalicelib.control import ControlPlane, ensure_table
    from chalicelib.protocol.codes import Role
    from chalicelib.protocol.models import InstanceGroup, RegisterInstanceRequest, StorageConfig
    from chalicelib.runtime import Runtime, set_runtime
    from chalicelib.settings import Settings

    rt = Runtime(settings=Settings(node_id="bench", auth_enabled=True), clock=ManualClock(time.time()), valkey=client)
    ensure_table(rt.aws("dynamodb"), rt.settings.control_table)
    control = rt.control
    control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": "/tmp/kvcm-bench-flood", "key_count_per_file": 8}}
        )
    )
    for name in ("ga", "gb"):
        control.create_group(InstanceGroup.model_validate({"name": name, "storage_candidates": ["nfs_01"]}))
    control.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": "ga",
                "instance_id": "tenant-a",
                "block_size": 16,
                "location_spec_infos": [{"name": "tp0", "size": 1024}],
                "model_deployment": {"model_name": "m", "dtype": "bf16"},
            }
        )
    )
    control.add_account("root", PASSWORD, Role.ROLE_ADMIN)
    control.add_account("engine-a", "", Role.ROLE_ENGINE, groups=["ga"])
    control.add_account("engine-b", "", Role.ROLE_ENGINE, groups=["gb"])
    keys = {name: control.create_api_key(name, 3600)[0] for name in ("engine-a", "engine-b")}
    other = ControlPlane(lambda: rt.aws("dynamodb"), rt.settings.control_table, rt.clock)
    set_runtime(rt)
    return rt, aws, keys, other


class Paced:
    """Calls ``step(i)`` ``rate_per_s`` times a second of the runtime's (manual) clock,
    whenever ``due()`` is asked: between tenant A's calls, as one container serves one
    request at a time."""

    def __init__(self, clock, rate_per_s: float, step: Callable[[int], None]) -> None:
        self.clock, self.rate_per_s, self.step = clock, rate_per_s, step
        self.start, self.done = clock.now(), 0

    def due(self) -> None:
        while self.done < (self.clock.now() - self.start) * self.rate_per_s:
            self.step(self.done)
            self.done += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per scenario, of the runtime's clock")
    seconds = parser.parse_args().seconds

    from chalicelib.control.api_keys import new_api_key
    from chalicelib.observability.logging import set_level
    from chalicelib.routes import admin, meta
    from chalicelib.routes.dispatch import Dispatcher

    set_level("WARN")  # no access line per request
    with valkey_server() as client:
        rt, aws, keys, other = build(client)
        try:
            dispatcher = Dispatcher(meta.OPERATIONS + admin.OPERATIONS)
            tenant_a = {"Authorization": f"Bearer {keys['engine-a']}"}
            tenant_b = {"Authorization": f"Bearer {keys['engine-b']}"}
            info = json.dumps({"instance_id": "tenant-a"})
            locate = json.dumps({"instance_id": "tenant-a", "query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2, 3]})
            counter = iter(range(10**9))

            def flood(i: int) -> None:
                bearer = {"Authorization": f"Bearer {new_api_key()[1]}"}
                dispatcher.handle(rt, "getInstanceInfo", info, bearer, f"10.66.0.{i % ADDRESSES}")

            def guess(i: int) -> None:
                bearer = {"Authorization": f"Bearer root:guess-{i:06d}-pw"}
                dispatcher.handle(rt, "listStorage", "{}", bearer, f"10.77.0.{i % ADDRESSES}")

            def register(i: int) -> None:
                body = {
                    "instance_group": "gb",
                    "instance_id": f"tenant-b-{next(counter)}",
                    "block_size": 16,
                    "location_spec_infos": [{"name": "tp0", "size": 1024}],
                    "model_deployment": {"model_name": "m", "dtype": "bf16"},
                }
                dispatcher.handle(rt, "registerInstance", json.dumps(body), tenant_b, "10.0.0.2")

            def add_account(i: int) -> None:
                from chalicelib.protocol.codes import Role

                other.add_account(f"tenant-{next(counter)}", "", Role.ROLE_ENGINE, groups=["gb"])

            scenarios: dict[str, list[tuple[float, Callable[[int], None]]]] = {
                "idle (baseline)": [],
                "anonymous flood": [(FLOOD_PER_S, flood), (GUESSES_PER_S, guess)],
                "control churn": [(REGISTRATIONS_PER_S, register), (ACCOUNTS_PER_S, add_account)],
                "flood + churn": [
                    (FLOOD_PER_S, flood),
                    (GUESSES_PER_S, guess),
                    (REGISTRATIONS_PER_S, register),
                    (ACCOUNTS_PER_S, add_account),
                ],
            }
            for body in (info, locate):  # warm: tenant A's key and instance cached
                dispatcher.handle(rt, "getCacheLocation" if body is locate else "getInstanceInfo", body, tenant_a)
            results = {}
            for name, load in scenarios.items():
                others = [Paced(rt.clock, rate, step) for rate, step in load]
                latencies, refused = [], 0
                end = rt.clock.now() + seconds
                while rt.clock.now() < end:
                    for api_name, body in (("getInstanceInfo", info), ("getCacheLocation", locate)):
                        rt.clock.advance(1 / LEGIT_PER_S)
                        for paced in others:
                            paced.due()
                        t0 = time.perf_counter()
                        status, answer = dispatcher.handle(rt, api_name, body, tenant_a, "10.0.0.1")
                        latencies.append(time.perf_counter() - t0)
                        refused += status != 200 or json.loads(answer)["header"]["status"]["code"] != "OK"
                quantiles = statistics.quantiles(latencies, n=100)
                extra = sum(paced.done for paced in others)
                results[name] = (quantiles[49] * 1e3, quantiles[98] * 1e3, len(latencies), refused, extra)
        finally:
            aws.stop()

    idle_p99 = results["idle (baseline)"][1]
    print(f"Tenant A's calls (getInstanceInfo + getCacheLocation, {LEGIT_PER_S}/s), {seconds:.0f} s per scenario")
    print(f"  {'scenario':<18} {'p50 ms':>8} {'p99 ms':>8} {'p99/idle':>9} {'calls':>7} {'refused':>8} {'others':>7}")
    for name, (p50, p99, calls, refused, extra) in results.items():
        print(f"  {name:<18} {p50:>8.2f} {p99:>8.2f} {p99 / idle_p99:>8.2f}x {calls:>7} {refused:>8} {extra:>7}")
    print(
        f"  load: {FLOOD_PER_S} random keys/s and {GUESSES_PER_S} password guesses/s, each from {ADDRESSES} addresses; "
        f"{REGISTRATIONS_PER_S} registrations/s (tenant B), {ACCOUNTS_PER_S} addAccount/s (another container)"
    )


if __name__ == "__main__":
    main()
