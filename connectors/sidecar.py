"""The relay's HTTP endpoint as a sidecar: ``/livez``, ``/readyz`` and ``/metrics``.

- ``/livez``: 200 while every rank's relay loop runs (a crashed loop is 503: restart me).
- ``/readyz``: 200 when every rank has a baseline, a complete state, and KVCM acknowledges
  its reports; else 503 with the reasons as JSON (KVCM unreachable, a permanent refusal
  such as INSTANCE_NOT_EXIST, an unfillable gap).
- ``/metrics``: Prometheus text, one series per DP rank (``docs/relay.md`` lists them).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .relay import Relay, RelayStats

#: (name, help, the stat read): the counters of ``/metrics``.
COUNTERS = (
    ("batches", "Event batches taken in, in order", "batches"),
    ("events", "Events in those batches", "events"),
    ("blocks_stored", "Blocks of BlockStored events indexed", "blocks_stored"),
    ("blocks_removed", "Blocks of BlockRemoved events indexed", "blocks_removed"),
    ("items_sent", "reportEvent items KVCM acknowledged", "items_sent"),
    ("requests", "reportEvent requests made", "requests"),
    ("retries", "reportEvent requests made again", "retries"),
    ("replay_requests", "Requests to the engine's replay socket", "replay_requests"),
    ("replayed_batches", "Batches a gap was filled with from the replay socket", "replayed_batches"),
    ("gaps", "Gaps in the engine's sequence numbers", "gaps"),
    ("gaps_unfilled", "Gaps the replay socket could no longer fill (the reporter was cleared)", "gaps_unfilled"),
    ("epochs", "Engine restarts seen (a new epoch each)", "epochs"),
    ("clears", "Times KVCM was told to forget this reporter's blocks", "clears"),
    ("keys_unchained", "Blocks without a key (--keys tokens, unknown parent)", "keys_unchained"),
)


def _labels(rank: int, **more: str) -> str:
    pairs = {"dp_rank": str(rank), **more}
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(relays: Sequence[Relay]) -> str:
    """The relays' stats in Prometheus' text format."""
    lines: list[str] = []
    ranked = [(relay.config.dp_rank or 0, relay.stats, relay) for relay in relays]
    for name, text, attr in COUNTERS:
        lines += [f"# HELP kvcm_relay_{name}_total {text}.", f"# TYPE kvcm_relay_{name}_total counter"]
        lines += [f"kvcm_relay_{name}_total{_labels(rank)} {getattr(stats, attr)}" for rank, stats, _ in ranked]
    for name, text, attr in (
        ("drops", "Blocks or items not reported, by why", "drops"),
        ("errors", "Errors, by kind", "errors"),
    ):
        lines += [f"# HELP kvcm_relay_{name}_total {text}.", f"# TYPE kvcm_relay_{name}_total counter"]
        for rank, stats, _ in ranked:
            counts: dict[str, int] = getattr(stats, attr)
            lines += [f"kvcm_relay_{name}_total{_labels(rank, kind=kind)} {n}" for kind, n in sorted(counts.items())]
    gauges: tuple[tuple[str, str, Callable[[RelayStats, Relay], float]], ...] = (
        (
            "lag_seconds",
            "From the engine's batch timestamp to KVCM's acknowledgement, last update",
            lambda s, r: s.lag_s,
        ),
        (
            "cursor",
            "The last sequence number KVCM acknowledged (-2: none)",
            lambda s, r: -2 if s.cursor is None else s.cursor,
        ),
        ("complete", "1 when the reported state is the engine's whole state", lambda s, r: int(s.complete)),
        ("ready", "1 when the rank is ready (see /readyz)", lambda s, r: int(r.alive() and not s.not_ready)),
    )
    for name, text, read in gauges:
        lines += [f"# HELP kvcm_relay_{name} {text}.", f"# TYPE kvcm_relay_{name} gauge"]
        lines += [f"kvcm_relay_{name}{_labels(rank)} {read(stats, relay)}" for rank, stats, relay in ranked]
    return "\n".join(lines) + "\n"


def readiness(relays: Sequence[Relay]) -> dict[str, dict[str, str]]:
    """Why each rank is not ready (empty when all are)."""
    out: dict[str, dict[str, str]] = {}
    for relay in relays:
        stats: RelayStats = relay.stats
        reasons = dict(stats.not_ready)
        if not relay.alive():
            reasons["loop"] = "the relay loop is not running"
        if reasons:
            out[str(relay.config.dp_rank or 0)] = reasons
    return out


class Sidecar:
    """Serves the three endpoints for ``relays`` on ``host:port`` (port 0: any free one)."""

    def __init__(self, relays: Sequence[Relay], host: str = "0.0.0.0", port: int = 9400) -> None:
        self.relays = list(relays)
        sidecar = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body, kind = sidecar.answer(self.path)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # probes every few seconds would drown the relay's own log

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name="kvcm-relay-http", daemon=True)

    def answer(self, path: str) -> tuple[int, bytes, str]:
        """(status, body, content type) of a GET of ``path``."""
        if path == "/livez":
            dead = [str(r.config.dp_rank or 0) for r in self.relays if not r.alive()]
            return (503 if dead else 200), json.dumps({"dead_ranks": dead}).encode(), "application/json"
        if path == "/readyz":
            reasons = readiness(self.relays)
            return (503 if reasons else 200), json.dumps({"not_ready": reasons}).encode(), "application/json"
        if path == "/metrics":
            return 200, metrics_text(self.relays).encode(), "text/plain; version=0.0.4"
        return 404, b'{"error": "try /livez, /readyz or /metrics"}', "application/json"

    def start(self) -> Sidecar:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
