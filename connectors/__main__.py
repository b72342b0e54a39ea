"""``python -m connectors``: run the relay next to a vLLM or SGLang engine.

Example (vLLM started with ``--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'``)::

    python -m connectors --endpoint tcp://127.0.0.1:5557 --replay-endpoint tcp://127.0.0.1:5558 \\
        --manager http://127.0.0.1:8000 --instance-id demo --host-ip-port 10.0.0.8:8080 --spec full_0
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Sequence

from chalicelib.protocol.block_keys import scheme_from_text
from chalicelib.protocol.errors import InvalidArgumentError

from .relay import Relay, RelayConfig


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m connectors", description=__doc__.splitlines()[0])
    p.add_argument("--endpoint", required=True, help="the engine's KV event PUB socket (tcp://host:port)")
    p.add_argument("--replay-endpoint", default="", help="its replay (ROUTER) socket, to fill gaps")
    p.add_argument("--topic", default="", help="the PUB topic (default: all)")
    p.add_argument("--manager", required=True, help="KVCM's URL (http[s]://host:port)")
    p.add_argument("--token", default="", help="bearer token (an API key) when KVCM has auth on")
    p.add_argument("--instance-id", required=True)
    p.add_argument("--host-ip-port", required=True, help="this engine's address, as routers should see it")
    p.add_argument(
        "--storage-type", default="ST_EVENT_REPORT_L1P5", choices=["ST_EVENT_REPORT_L1P5", "ST_EVENT_REPORT_L2"]
    )
    p.add_argument("--spec", action="append", default=[], help="a location spec name each block carries (repeat)")
    p.add_argument("--uri-template", default=RelayConfig.uri_template)
    p.add_argument("--medium", default="gpu", help="the medium of events that name none")
    p.add_argument(
        "--keys",
        choices=["engine", "tokens"],
        default="engine",
        help="block keys: the engine's hashes, or KVCM's keys of the token ids",
    )
    p.add_argument("--block-size", type=int, default=0, help="tokens per block (--keys tokens)")
    p.add_argument("--key-scheme", default="", help="the instance's key_scheme, a name or its JSON (--keys tokens)")
    p.add_argument("--max-batch", type=int, default=1000)
    p.add_argument("--flush-ms", type=float, default=50)
    p.add_argument("--heartbeat-s", type=float, default=5)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.keys == "tokens" and args.block_size <= 0:
        raise SystemExit("--keys tokens needs --block-size")
    try:
        scheme_from_text(args.key_scheme)
    except InvalidArgumentError as exc:
        raise SystemExit(f"--key-scheme: {exc}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = RelayConfig(
        manager_url=args.manager,
        instance_id=args.instance_id,
        host_ip_port=args.host_ip_port,
        storage_type=args.storage_type,
        spec_names=tuple(args.spec or ["full_0"]),
        uri_template=args.uri_template,
        default_medium=args.medium,
        keys=args.keys,
        block_size=args.block_size,
        key_scheme=args.key_scheme,
        max_batch=args.max_batch,
        flush_interval_s=args.flush_ms / 1000,
        heartbeat_interval_s=args.heartbeat_s,
        token=args.token,
    )
    relay = Relay(config, args.endpoint, args.replay_endpoint, topic=args.topic.encode()).start()
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    stopped.wait()
    relay.stop()
    logging.getLogger("kvcm.relay").info("stopped: %s", relay.stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
