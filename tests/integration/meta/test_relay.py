"""The engine-side relay (connectors/): real msgpack frames of vLLM's published KV event
schema over real ZMQ sockets, relayed into reportEvent on real Valkey and moto.

The frames are built here from the documented schema (``vllm/distributed/kv_events.py``:
msgspec structs with ``array_like=True``, events tagged by class name; multipart
``(topic, seq, payload)``), not with vLLM's classes: vLLM is not installed (it needs a GPU
build)."""

from __future__ import annotations

import threading
import time

import msgpack
import pytest
import zmq

from chalicelib.protocol.block_keys import keys_from_tokens
from connectors.kv_events import block_key, decode_batch
from connectors.relay import Relay, RelayConfig, RelayStats, Sender, TransportError

from .harness import HOST, code, hosts

END = (-1).to_bytes(8, "big", signed=True)


def stored(hashes, tokens, parent=None, block_size=4, medium="GPU"):
    return ["BlockStored", hashes, parent, tokens, block_size, None, medium]


def batch(*events) -> bytes:
    return msgpack.packb([time.time(), list(events)])


class Engine:
    """A PUB socket and a ROUTER replay socket answering from everything published."""

    def __init__(self, context) -> None:
        self.pub = context.socket(zmq.PUB)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.router = context.socket(zmq.ROUTER)
        self.replay_endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, _, start = self.router.recv_multipart()
            start = int.from_bytes(start, "big")
            self.replay_requests.append(start)
            for seq, payload in self.buffer:
                if seq >= start:
                    self.router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", END, b""])

    def publish(self, seq: int, payload: bytes, send: bool = True) -> None:
        self.buffer.append((seq, payload))
        if send:
            self.pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pub.close(0)
        self.router.close(0)


class AppTransport:
    """reportEvent through the app (chalice's test client), failing the first ``failures`` calls."""

    def __init__(self, http, failures: int = 0) -> None:
        self.http, self.failures, self.calls = http, failures, 0

    def post(self, body: dict) -> dict:
        self.calls += 1
        if self.calls <= self.failures:
            raise TransportError("connection refused")
        return self.http("reportEvent", body)


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


@pytest.fixture
def engine(context):
    running = Engine(context)
    yield running
    running.close()


def until(condition, timeout_s: float = 10.0) -> None:
    """Wait for what other threads do over real sockets (no clock to advance there)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def start_relay(http, engine, context, **config) -> Relay:
    relay = Relay(
        RelayConfig(
            manager_url="",
            instance_id="e1",
            host_ip_port=HOST,
            flush_interval_s=0.01,
            heartbeat_interval_s=0.05,
            **config,
        ),
        engine.endpoint,
        engine.replay_endpoint,
        transport=AppTransport(http),
        context=context,
    ).start()
    relay.subscribed.wait()
    return relay


def first_message(engine, relay, payload) -> None:
    """Publish sequence 1 until the subscriber has it (ZMQ drops what a PUB sends before a
    SUB has joined)."""
    engine.buffer.append((1, payload))

    def received():
        engine.pub.send_multipart([b"kv", (1).to_bytes(8, "big"), payload])
        return relay.last_seq == 1

    until(received)


def test_the_documented_frames_decode():
    decoded = decode_batch(
        batch(stored([1, b"\x00" * 7 + b"\x02"], list(range(8))), ["BlockRemoved", [1]], ["AllBlocksCleared"])
    )
    assert [type(e).__name__ for e in decoded.events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    assert [block_key(h) for h in decoded.events[0].block_hashes] == [1, 2]
    assert block_key(2**64 - 1) == -1


def test_stored_removed_and_cleared_blocks_reach_host_state(http, er, engine, context):
    relay = start_relay(http, engine, context)
    try:
        first_message(engine, relay, batch(stored([11, 12, 13], list(range(12)))))
        until(lambda: hosts(http, [11, 12, 13]) == {HOST: 3})
        engine.publish(2, batch(["BlockRemoved", [12], "GPU"]))
        until(lambda: hosts(http, [11, 12, 13]) == {HOST: 1})
        engine.publish(3, batch(["AllBlocksCleared"]))
        until(lambda: hosts(http, [11]) == {})
        engine.publish(4, batch(stored([21], list(range(4)))))
        until(lambda: hosts(http, [21]) == {HOST: 1})  # registered again after the clear
    finally:
        relay.stop()
    assert relay.stats.items_dropped == 0 and relay.stats.errors == []


def test_a_gap_is_filled_from_the_replay_socket(http, er, engine, context):
    relay = start_relay(http, engine, context)
    try:
        first_message(engine, relay, batch(stored([1], list(range(4)))))
        engine.publish(2, batch(stored([2], list(range(4, 8)), parent=1)), send=False)  # lost on the PUB
        engine.publish(3, batch(stored([3], list(range(8, 12)), parent=2)))
        until(lambda: hosts(http, [1, 2, 3]) == {HOST: 3})
    finally:
        relay.stop()
    assert engine.replay_requests == [2] and relay.stats.replayed == 1 and relay.stats.gaps_lost == 0


def test_token_keys_are_kvcms_keys_of_the_prompt(http, er, engine, context):
    tokens = list(range(100, 124))
    relay = start_relay(http, engine, context, keys="tokens", block_size=4)
    try:
        first_message(engine, relay, batch(stored([b"a", b"b"], tokens[:8])))
        engine.publish(2, batch(stored([b"c", b"d"], tokens[8:16], parent=b"b")))
        keys = keys_from_tokens(tokens, 4)
        until(lambda: hosts(http, keys) == {HOST: 4})
    finally:
        relay.stop()


def test_the_sender_retries_and_registers_again(http, er):
    stats = RelayStats()
    sender = Sender(
        RelayConfig(manager_url="", instance_id="e1", host_ip_port=HOST, retry_base_s=0.0),
        AppTransport(http, failures=2),
        stats,
        sleep=lambda s: None,
    )
    add = {
        "event_type": "EVENT_BLOCK_ADD",
        "block_add": {"block_key": "5", "medium": "gpu", "specs": [{"name": "full_0", "uri": "x://h/5"}]},
    }
    sender.send([add])
    assert stats.retries == 2 and stats.items_sent == 1 and hosts(http, [5]) == {HOST: 1}
    assert (
        code(
            http(
                "reportEvent",
                {
                    "instance_id": "e1",
                    "host_ip_port": HOST,
                    "storage_type": "ST_EVENT_REPORT_L1P5",
                    "events": [{"event_type": "EVENT_HOST_DOWN", "host_down": {}}],
                },
            )
        )
        == "OK"
    )
    sender.send([add])  # NODE_NOT_REGISTERED: registers, sends again
    assert stats.items_sent == 2 and hosts(http, [5]) == {HOST: 1}
