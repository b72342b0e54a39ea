"""``kvcm-relay`` (or ``python -m connectors``): report a vLLM or SGLang engine's KV-cache
events to KVCM, as a sidecar beside the engine.

Example (vLLM started with ``--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'``)::

    kvcm-relay --endpoint tcp://127.0.0.1:5557 --replay-endpoint tcp://127.0.0.1:5558 \\
        --manager http://127.0.0.1:8000 --instance-id demo --host-ip-port 10.0.0.8:8080 --spec full_0

With ``--dp-size N`` one relay per DP rank runs, rank r on the endpoints' ports + r (as both
engines bind them), each reporting as its own host: ``--host-ip-port`` must then name
``{dp_rank}``. See docs/relay.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import threading
from collections.abc import Sequence

from chalicelib.protocol.block_keys import scheme_from_text
from chalicelib.protocol.errors import InvalidArgumentError

from .relay import FULL_ATTENTION_KINDS, Relay, RelayConfig
from .sidecar import Sidecar

API_KEY_ENV = "KVCM_API_KEY"
log = logging.getLogger("kvcm.relay")


def _pair(text: str) -> tuple[str, str]:
    engine, sep, kvcm = text.partition("=")
    if not sep or not engine:
        raise argparse.ArgumentTypeError(f"{text!r} is not ENGINE_MEDIUM=KVCM_MEDIUM")
    return engine.upper(), kvcm


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvcm-relay", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--endpoint", required=True, help="the engine's KV event PUB socket (tcp://host:port), rank 0's")
    p.add_argument("--replay-endpoint", default="", help="its replay (ROUTER) socket, for baselines and gaps")
    p.add_argument("--topic", default="", help="the PUB topic (default: all)")
    p.add_argument("--manager", required=True, help="KVCM's URL (http[s]://host:port)")
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV, ""),
        help=f"the engine's API key, sent as bearer when KVCM has auth on (default: ${API_KEY_ENV})",
    )
    p.add_argument("--instance-id", required=True)
    p.add_argument("--host-ip-port", required=True, help="this engine's address as routers see it; {dp_rank} per rank")
    p.add_argument("--dp-size", type=int, default=1, help="DP ranks of the engine, one relay each (default 1)")
    p.add_argument(
        "--storage-type", default="ST_EVENT_REPORT_L1P5", choices=["ST_EVENT_REPORT_L1P5", "ST_EVENT_REPORT_L2"]
    )
    p.add_argument("--spec", action="append", default=[], help="a location spec name each block carries (repeat)")
    p.add_argument("--uri-template", default=RelayConfig.uri_template)
    p.add_argument("--medium", default="GPU", help="the engine medium of events that name none (default GPU)")
    p.add_argument(
        "--media",
        action="append",
        type=_pair,
        default=[],
        metavar="ENGINE=KVCM",
        help="map an engine medium to a KVCM medium; empty to leave it unreported (repeat)",
    )
    p.add_argument(
        "--keys",
        choices=["engine", "tokens"],
        default="engine",
        help="block keys: the engine's hashes (low 64 bits), or KVCM's keys of the token ids per namespace",
    )
    p.add_argument("--block-size", type=int, default=0, help="tokens per block (--keys tokens)")
    p.add_argument("--key-scheme", default="", help="the instance's key_scheme, a name or its JSON (--keys tokens)")
    p.add_argument("--group", action="append", type=int, default=[], help="index this KV-cache group_idx (repeat)")
    p.add_argument(
        "--group-kind",
        action="append",
        default=[],
        help=f"index groups of this kv_cache_spec_kind (repeat; default {', '.join(FULL_ATTENTION_KINDS)})",
    )
    p.add_argument("--max-batch", type=int, default=1000)
    p.add_argument("--flush-ms", type=float, default=50)
    p.add_argument("--heartbeat-s", type=float, default=5)
    p.add_argument("--stats-s", type=float, default=60, help="log the counters this often")
    p.add_argument("--health-host", default="0.0.0.0")
    p.add_argument("--health-port", type=int, default=9400, help="/livez, /readyz and /metrics (0: any free port)")
    return p


def _ranked(endpoint: str, rank: int) -> str:
    """The engines' own rule (``offset_endpoint_port``): a tcp port plus the rank."""
    if rank == 0 or not endpoint:
        return endpoint
    base, _, port = endpoint.rpartition(":")
    return f"{base}:{int(port) + rank}"


def configs(args: argparse.Namespace) -> list[tuple[RelayConfig, str, str]]:
    """One relay's configuration and endpoints per DP rank; SystemExit naming the flag when
    the arguments cannot work."""
    if args.keys == "tokens" and args.block_size <= 0:
        raise SystemExit("kvcm-relay: --keys tokens needs --block-size")
    try:
        scheme_from_text(args.key_scheme)
    except InvalidArgumentError as exc:
        raise SystemExit(f"--key-scheme: {exc}") from None
    if args.dp_size < 1:
        raise SystemExit("kvcm-relay: --dp-size must be at least 1")
    if args.dp_size > 1 and "{dp_rank}" not in args.host_ip_port:
        raise SystemExit(
            "kvcm-relay: --host-ip-port must name {dp_rank} when --dp-size > 1 (each rank is its own host)"
        )
    for flag, endpoint in (("--endpoint", args.endpoint), ("--replay-endpoint", args.replay_endpoint)):
        if endpoint and args.dp_size > 1 and not re.search(r":\d+$", endpoint):
            raise SystemExit(f"kvcm-relay: {flag} needs a tcp port to offset per DP rank")
    out = []
    for rank in range(args.dp_size):
        config = RelayConfig(
            manager_url=args.manager,
            instance_id=args.instance_id,
            host_ip_port=args.host_ip_port.replace("{dp_rank}", str(rank)),
            storage_type=args.storage_type,
            spec_names=tuple(args.spec or ["full_0"]),
            uri_template=args.uri_template,
            default_medium=args.medium,
            media=dict(args.media),
            keys=args.keys,
            block_size=args.block_size,
            key_scheme=args.key_scheme,
            groups=tuple(args.group),
            group_kinds=tuple(args.group_kind) or FULL_ATTENTION_KINDS,
            dp_rank=rank,
            max_batch=args.max_batch,
            flush_interval_s=args.flush_ms / 1000,
            heartbeat_interval_s=args.heartbeat_s,
            stats_interval_s=args.stats_s,
            token=args.api_key,
        )
        out.append((config, _ranked(args.endpoint, rank), _ranked(args.replay_endpoint, rank)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the relays and their HTTP endpoint until SIGINT or SIGTERM; the exit code."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    planned = configs(args)
    relays = [Relay(config, endpoint, replay, topic=args.topic.encode()) for config, endpoint, replay in planned]
    sidecar = Sidecar(relays, args.health_host, args.health_port).start()
    log.info("health and metrics on http://%s:%d (/livez, /readyz, /metrics)", args.health_host, sidecar.port)
    for relay in relays:
        relay.start()
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    stopped.wait()
    for relay in relays:
        relay.stop()
        log.info("stopped rank %s: %s", relay.config.dp_rank, relay.stats.summary())
    sidecar.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
