"""The engine-side relay (connectors/) with frames built by hand: the engines' older
positional schema (vLLM's 6- and 7-field BlockStored, before the tagged maps of
``test_relay_engines.py``), KVCM's refusals and retries, over real ZMQ sockets into
reportEvent on real Valkey and moto."""

from __future__ import annotations

import logging
import threading
import time

import msgpack
import pytest
import zmq

from chalicelib.protocol.block_keys import keys_from_tokens
from connectors.relay import Relay, RelayConfig, RelayStats, Sender, TransportError

from .harness import HOST, code, hosts

END = (-1).to_bytes(8, "big", signed=True)


def stored(hashes, tokens, parent=None, block_size=4, medium="GPU", lora_name=None):
    """vLLM's positional BlockStored: 6 fields, 7 with ``lora_name``."""
    event = ["BlockStored", hashes, parent, tokens, block_size, None, medium]
    return event + [lora_name] if lora_name else event


def batch(*events) -> bytes:
    return msgpack.packb([time.time(), list(events)])


class Engine:
    """A PUB socket and a ROUTER replay socket answering from everything published, in the
    older replay form (no topic frame)."""

    def __init__(self, context) -> None:
        self.pub = context.socket(zmq.PUB)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.router = context.socket(zmq.ROUTER)
        self.replay_endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, _, start = self.router.recv_multipart()
            start = int.from_bytes(start, "big")
            self.replay_requests.append(start)
            with self._lock:
                buffered = list(self.buffer)
            for seq, payload in buffered:
                if seq >= start:
                    self.router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", END, b""])

    def publish(self, payload: bytes, send: bool = True) -> None:
        with self._lock:
            seq = len(self.buffer)
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


def start_relay(http, engine, context, instance="e1", **config) -> Relay:
    return Relay(
        RelayConfig(
            manager_url="",
            instance_id=instance,
            host_ip_port=HOST,
            flush_interval_s=0.01,
            heartbeat_interval_s=0.05,
            retry_base_s=0.01,
            retry_max_s=0.05,
            **config,
        ),
        engine.endpoint,
        engine.replay_endpoint,
        transport=AppTransport(http),
        context=context,
    ).start()


def test_the_older_positional_forms_reach_host_state(http, er, engine, context):
    relay = start_relay(http, engine, context)
    try:
        engine.publish(batch(stored([11, 12, 13], list(range(12)))))
        until(lambda: hosts(http, [11, 12, 13]) == {HOST: 3})
        engine.publish(batch(stored([14], list(range(12, 16)), parent=13, lora_name="ad1")))  # 7 fields
        engine.publish(batch(["BlockRemoved", [12], "GPU"]))
        until(lambda: hosts(http, [11, 12, 13]) == {HOST: 1})
        engine.publish(batch(["AllBlocksCleared"]))
        until(lambda: hosts(http, [11]) == {})
        engine.publish(batch(stored([21], list(range(4)))))
        until(lambda: hosts(http, [21]) == {HOST: 1})  # registered again after the clear
    finally:
        relay.stop()
    assert not relay.stats.drops and not relay.stats.errors and relay.stats.complete


def test_a_gap_is_filled_from_a_replay_socket_without_topic_frames(http, er, engine, context):
    relay = start_relay(http, engine, context)
    try:
        engine.publish(batch(stored([1], list(range(4)))))
        until(lambda: relay.stats.cursor == 0)
        engine.publish(batch(stored([2], list(range(4, 8)), parent=1)), send=False)  # lost on the PUB
        engine.publish(batch(stored([3], list(range(8, 12)), parent=2)))
        until(lambda: hosts(http, [1, 2, 3]) == {HOST: 3})
    finally:
        relay.stop()
    assert engine.replay_requests == [0, 1] and relay.stats.replayed_batches == 1 and relay.stats.gaps_unfilled == 0


def test_token_keys_are_kvcms_keys_of_the_prompt(http, er, engine, context):
    tokens = list(range(100, 124))
    relay = start_relay(http, engine, context, keys="tokens", block_size=4)
    try:
        engine.publish(batch(stored([b"a", b"b"], tokens[:8])))
        engine.publish(batch(stored([b"c", b"d"], tokens[8:16], parent=b"b")))
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
        wait=lambda s: False,
    )
    add = {
        "event_type": "EVENT_BLOCK_ADD",
        "block_add": {"block_key": "5", "medium": "gpu", "specs": [{"name": "full_0", "uri": "x://h/5"}]},
    }
    registered = []
    sender.deliver([add], register=lambda: registered.append(sender.register(["gpu"])))
    assert stats.retries == 2 and stats.items_sent == 1 and hosts(http, [5]) == {HOST: 1}
    sender.host_down()
    forgotten = sender.deliver([add], register=lambda: registered.append(sender.register(["gpu"])))
    assert forgotten and len(registered) == 1 and stats.items_sent == 3 and hosts(http, [5]) == {HOST: 1}
    assert stats.errors["unreachable"] == 2 and not stats.drops


def test_an_unknown_instance_is_an_error_that_fails_readiness(http, er, engine, context, caplog):
    caplog.set_level(logging.INFO, logger="kvcm.relay")
    relay = start_relay(http, engine, context, instance="nosuch")
    try:
        engine.publish(batch(stored([1], list(range(4)))))
        until(lambda: "refused" in relay.stats.not_ready)
        assert "INSTANCE_NOT_EXIST" in relay.stats.not_ready["refused"] and relay.stats.cursor is None
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and "INSTANCE_NOT_EXIST" in r.getMessage()]
        assert len(errors) == 1, "logged once as an error, not a warning per retry"
        assert any("config:" in r.getMessage() and "nosuch" in r.getMessage() for r in caplog.records)
    finally:
        relay.stop()
    assert code(http("getInstanceInfo", {"instance_id": "nosuch"})) == "INSTANCE_NOT_EXIST"
