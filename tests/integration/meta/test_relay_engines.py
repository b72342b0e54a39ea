"""The relay driven by the engines' own publishers: vLLM 0.33.0's and SGLang 0.5.23's
``ZmqEventPublisher`` (PUB plus ROUTER replay, from their released wheels, see
``tests/engines/loader.py``) over real ZMQ sockets on 127.0.0.1, into reportEvent and
getHostCacheState on real Valkey and moto."""

from __future__ import annotations

import socket
import time

import pytest
import zmq

from connectors.relay import Relay, RelayConfig
from tests.engines.loader import load

from .harness import HOST, hosts
from .test_relay import AppTransport, until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_span(count: int) -> int:
    """The first of ``count`` consecutive free ports (DP ranks bind port + rank)."""
    while True:
        base = free_port()
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()


class VllmEngine:
    """vLLM's publisher and the events its block pool builds (``vllm/v1/core/block_pool.py``)."""

    def __init__(self, buffer_steps: int = 10_000, dp_rank: int = 0, ports: tuple[int, int] | None = None) -> None:
        self.kv = load("vllm")
        pub, replay = ports or (free_port(), free_port())
        self.ports = (pub, replay)
        self.endpoint = f"tcp://127.0.0.1:{pub + dp_rank}"
        self.replay_endpoint = f"tcp://127.0.0.1:{replay + dp_rank}"
        self.publisher = self.kv.ZmqEventPublisher(
            data_parallel_rank=dp_rank,
            endpoint=f"tcp://*:{pub}",
            replay_endpoint=f"tcp://*:{replay}",
            buffer_steps=buffer_steps,
        )

    def stored(self, hashes, tokens, parent=None, block_size=4, group=0, kind="full_attention", **fields):
        return self.kv.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=block_size,
            lora_id=None,
            medium="GPU",
            lora_name=fields.pop("lora_name", None),
            group_idx=group,
            kv_cache_spec_kind=kind,
            **fields,
        )

    def removed(self, hashes, group=0, medium="GPU"):
        return self.kv.BlockRemoved(block_hashes=hashes, medium=medium, group_idx=group)

    def cleared(self):
        return self.kv.AllBlocksCleared()

    def publish(self, *events) -> None:
        self.publisher.publish(self.kv.KVEventBatch(ts=time.time(), events=list(events)))

    def close(self) -> None:
        self.publisher.shutdown()


@pytest.fixture
def vllm():
    engine = VllmEngine()
    yield engine
    engine.close()


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


def start(http, engine, context, **config) -> Relay:
    settings = {"instance_id": "e1", "host_ip_port": HOST, "flush_interval_s": 0.01, "heartbeat_interval_s": 0.05}
    relay = Relay(
        RelayConfig(manager_url="", **{**settings, **config}),
        engine.endpoint,
        engine.replay_endpoint,
        transport=AppTransport(http),
        context=context,
    ).start()
    return relay


def visible(http, relay, keys, expected, timeout_s: float = 10.0) -> None:
    """Wait until getHostCacheState shows ``expected``, failing at once on a relay error."""
    deadline = time.monotonic() + timeout_s
    while hosts(http, keys) != expected:
        assert not relay.stats.errors, relay.stats.summary()
        assert time.monotonic() < deadline, f"timed out: {hosts(http, keys)} != {expected}; {relay.stats.summary()}"
        time.sleep(0.01)


def test_vllm_stores_removals_and_clears_reach_host_state(http, er, vllm, context):
    relay = start(http, vllm, context)
    try:
        vllm.publish(vllm.stored([11, 12, 13], list(range(12))))
        visible(http, relay, [11, 12, 13], {HOST: 3})
        vllm.publish(vllm.removed([12]))
        visible(http, relay, [11, 12, 13], {HOST: 1})
        vllm.publish(vllm.cleared())
        visible(http, relay, [11], {})
        vllm.publish(vllm.stored([21], list(range(4))))
        visible(http, relay, [21], {HOST: 1})
    finally:
        relay.stop()
    assert not relay.stats.drops and relay.stats.complete


class DroppingSocket:
    """The publisher's PUB socket, losing the next ``n`` messages on the way (what a PUB
    past its high-water mark does); the publisher still buffers them for replay."""

    def __init__(self, sock) -> None:
        self.sock, self.lose = sock, 0

    def send_multipart(self, frames) -> None:
        if self.lose:
            self.lose -= 1
            return
        self.sock.send_multipart(frames)

    def close(self, linger=None) -> None:
        self.sock.close(linger=linger)


def lossy(engine) -> DroppingSocket:
    engine.publisher._pub = DroppingSocket(engine.publisher._pub)
    return engine.publisher._pub


def test_vllm_bytes_hashes_are_keyed_by_their_low_64_bits(http, er, vllm, context):
    digests = [bytes(range(i, i + 32)) for i in (1, 2)]
    keys = [int.from_bytes(d, "big") & (2**64 - 1) for d in digests]  # vLLM's maybe_convert_block_hash
    keys = [k - 2**64 if k >= 2**63 else k for k in keys]
    relay = start(http, vllm, context)
    try:
        vllm.publish(vllm.stored(digests, list(range(8))))
        visible(http, relay, keys, {HOST: 2})
    finally:
        relay.stop()


def test_vllm_blocks_published_before_the_relay_starts_come_from_the_replay_socket(http, er, vllm, context):
    vllm.publish(vllm.stored([1, 2], list(range(8))))
    vllm.publish(vllm.removed([2]))
    until(lambda: len(vllm.publisher._buffer) == 2)
    relay = start(http, vllm, context)
    try:
        visible(http, relay, [1], {HOST: 1})
        until(lambda: relay.stats.cursor == 1)
        assert hosts(http, [1, 2]) == {HOST: 1} and relay.stats.complete
    finally:
        relay.stop()


def test_vllm_a_gap_is_filled_from_the_replay_socket(http, er, vllm, context):
    relay = start(http, vllm, context)
    try:
        vllm.publish(vllm.stored([1], list(range(4))))
        visible(http, relay, [1], {HOST: 1})
        lossy(vllm).lose = 2
        vllm.publish(vllm.stored([2], list(range(4, 8)), parent=1))
        vllm.publish(vllm.removed([1]))
        vllm.publish(vllm.stored([3], list(range(8, 12)), parent=2))
        visible(http, relay, [3], {HOST: 1})
        assert hosts(http, [1]) == {} and relay.stats.replayed_batches == 2 and relay.stats.gaps_unfilled == 0
        assert relay.stats.complete and not relay.stats.not_ready
    finally:
        relay.stop()


def test_vllm_an_unfillable_gap_clears_the_host_and_says_incomplete_until_a_clear(http, er, context):
    engine = VllmEngine(buffer_steps=2)
    relay = start(http, engine, context)
    try:
        engine.publish(engine.stored([1, 2], list(range(8))))
        visible(http, relay, [1, 2], {HOST: 2})
        lossy(engine).lose = 3
        engine.publish(engine.removed([2]))  # lost, and pushed out of the replay buffer
        engine.publish(engine.stored([5], list(range(4))))
        engine.publish(engine.stored([6], list(range(4, 8)), parent=5))
        engine.publish(engine.stored([7], list(range(8, 12)), parent=6))
        # seq 1 and 2 are gone for good, seq 3 is replayed: block 1's fate is unknown (its
        # BlockRemoved may be in the gap), so KVCM no longer shows it; 5 was in the gap too
        visible(http, relay, [6, 7], {HOST: 2})
        assert hosts(http, [1]) == {} and hosts(http, [5]) == {} and relay.stats.gaps_unfilled == 1
        assert not relay.stats.complete and "incomplete" in relay.stats.not_ready
        engine.publish(engine.cleared())
        engine.publish(engine.stored([8], list(range(4))))
        visible(http, relay, [8], {HOST: 1})
        assert relay.stats.complete and not relay.stats.not_ready and hosts(http, [6]) == {}
    finally:
        relay.stop()
        engine.close()


def restarted(engine: VllmEngine) -> VllmEngine:
    """A new publisher on the engine's ports (seq from 0 again), once its I/O thread has let
    the old sockets' ports go."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return VllmEngine(ports=engine.ports)
        except zmq.ZMQError:
            assert time.monotonic() < deadline, "the old publisher's ports stay bound"
            time.sleep(0.05)


def test_vllm_an_engine_restart_is_a_new_epoch(http, er, context):
    first = VllmEngine()
    relay = start(http, first, context)
    try:
        first.publish(first.stored([1, 2], list(range(8))))
        first.publish(first.stored([3], list(range(8, 12)), parent=2))
        visible(http, relay, [1, 2, 3], {HOST: 3})
        first.close()
        second = restarted(first)
        second.publish(second.stored([1], list(range(4))))
        second.publish(second.stored([9], list(range(4, 8)), parent=1))
        visible(http, relay, [1, 9], {HOST: 2})
        assert hosts(http, [1, 2, 3]) == {HOST: 1} and relay.stats.epochs == 1
        second.close()
    finally:
        relay.stop()


class SglangEngine:
    """SGLang's publisher (``sglang/srt/disaggregation/kv_events.py``) for one attention-DP rank."""

    def __init__(self, dp_rank: int = 0, ports: tuple[int, int] | None = None) -> None:
        self.kv = load("sglang")
        pub, replay = ports or (free_port(), free_port())
        self.endpoint = f"tcp://127.0.0.1:{pub + dp_rank}"
        self.replay_endpoint = f"tcp://127.0.0.1:{replay + dp_rank}"
        self.publisher = self.kv.ZmqEventPublisher(
            attn_dp_rank=dp_rank,
            endpoint=f"tcp://127.0.0.1:{pub}",
            replay_endpoint=f"tcp://127.0.0.1:{replay}",
            bind=True,
        )

    def stored(self, hashes, tokens, parent=None, medium="GPU", **fields):
        return self.kv.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=4,
            lora_id=None,
            medium=medium,
            **fields,
        )

    def publish(self, *events) -> None:
        self.publisher.publish(self.kv.KVEventBatch(ts=time.time(), events=list(events)))

    def close(self) -> None:
        self.publisher.shutdown()


def test_sglang_stores_removals_and_clears_reach_host_state(http, er, context):
    engine = SglangEngine()
    relay = start(http, engine, context)
    try:
        engine.publish(engine.stored([5, 6], list(range(8)), cache_salt="tenant-a", lora_name="ad1"))
        visible(http, relay, [5, 6], {HOST: 2})
        engine.publish(engine.kv.BlockRemoved(block_hashes=[6], medium="GPU"))
        visible(http, relay, [5, 6], {HOST: 1})
        engine.publish(engine.kv.AllBlocksCleared())
        visible(http, relay, [5], {})
        engine.publish(engine.stored([7], list(range(4)), medium=engine.kv.StorageMedium.CPU))
        visible(http, relay, [7], {HOST: 1})
        assert hosts(http, [7], medium=["mem"]) == {HOST: 1} and hosts(http, [7], medium=["gpu"]) == {}
    finally:
        relay.stop()
        engine.close()
    assert not relay.stats.drops and relay.stats.complete


def test_each_dp_rank_has_its_own_reporter(http, er, context):
    """vLLM and SGLang offset their ports by the DP rank; each rank's relay reports as its
    own host and refuses batches of another rank."""
    base = free_span(4)
    ports = (base, base + 2)  # rank r: PUB base + r, replay base + 2 + r
    engines = [SglangEngine(dp_rank=rank, ports=ports) for rank in (0, 1)]
    relays = [
        Relay(
            RelayConfig(
                manager_url="",
                instance_id="e1",
                host_ip_port=f"10.0.0.8:{8080 + rank}",
                dp_rank=rank,
                flush_interval_s=0.01,
            ),
            engine.endpoint,
            engine.replay_endpoint,
            transport=AppTransport(http),
            context=context,
        ).start()
        for rank, engine in enumerate(engines)
    ]
    try:
        engines[0].publish(engines[0].stored([1, 2], list(range(8))))
        engines[1].publish(engines[1].stored([1], list(range(4))))
        until(lambda: hosts(http, [1, 2]) == {"10.0.0.8:8080": 2, "10.0.0.8:8081": 1})
        engines[1].publish(engines[1].kv.BlockRemoved(block_hashes=[1], medium="GPU"))
        until(lambda: hosts(http, [1, 2]) == {"10.0.0.8:8080": 2})
        rank0 = engines[0].kv.KVEventBatch(
            ts=time.time(), events=[engines[0].stored([9], list(range(4)))], attn_dp_rank=0
        )
        engines[1].publisher.publish(rank0)  # a batch of rank 0 on rank 1's socket
        until(lambda: relays[1].stats.errors["other dp rank"] == 1)
        assert hosts(http, [9]) == {}
    finally:
        for relay in relays:
            relay.stop()
        for engine in engines:
            engine.close()


def test_vllm_hybrid_model_indexes_full_attention_groups_only(http, er, vllm, context):
    """vLLM emits one BlockStored per KV-cache group with the same hashes (its hashes do not
    mix the group in): a sliding-window group's removals must not remove the full-attention
    group's blocks."""
    relay = start(http, vllm, context)
    try:
        vllm.publish(
            vllm.stored([1, 2, 3], list(range(12)), group=0),
            vllm.stored([1, 2, 3], list(range(12)), group=1, kind="sliding_window", kv_cache_spec_sliding_window=4),
        )
        visible(http, relay, [1, 2, 3], {HOST: 3})
        vllm.publish(vllm.removed([1, 2], group=1))  # the window slid past them
        vllm.publish(vllm.stored([4], list(range(12, 16)), parent=3, group=0))
        visible(http, relay, [1, 2, 3, 4], {HOST: 4})
        vllm.publish(vllm.removed([4], group=0))
        visible(http, relay, [1, 2, 3, 4], {HOST: 3})
        assert relay.stats.drops["group not indexed"] == 3
    finally:
        relay.stop()


def test_vllm_hybrid_groups_chosen_by_index(http, er, vllm, context):
    relay = start(http, vllm, context, groups=(1,))
    try:
        vllm.publish(
            vllm.stored([1, 2], list(range(8)), group=0), vllm.stored([7, 8], list(range(8)), group=1, kind="mamba")
        )
        visible(http, relay, [7, 8], {HOST: 2})
        assert hosts(http, [1]) == {}
    finally:
        relay.stop()


def test_token_keys_keep_adapters_and_tenants_apart(http, er, vllm, context):
    """With --keys tokens, blocks of different LoRA adapters, cache salts or multimodal inputs
    (vLLM's extra_keys) get keys of their own; plain blocks get KVCM's keys of the tokens."""
    from chalicelib.protocol.block_keys import keys_from_tokens
    from connectors.kv_events import decode_batch
    from connectors.relay import RelayStats, Translator

    tokens = list(range(8))
    config = {"keys": "tokens", "block_size": 4}
    events = [
        vllm.stored([1, 2], tokens),
        vllm.stored([3, 4], tokens, lora_name="ad1", extra_keys=[("ad1",), ("ad1",)]),
        vllm.stored([5, 6], tokens, lora_name="ad2", extra_keys=[("ad2",), ("ad2",)]),
        vllm.stored([7, 8], tokens, extra_keys=[("salt-b",), None]),
        vllm.stored([9, 10], tokens, extra_keys=[(("img-1", 0),), None]),
    ]
    oracle = Translator(RelayConfig(manager_url="", instance_id="e1", host_ip_port=HOST, **config), RelayStats())
    wire = [
        decode_batch(vllm.kv.msgspec.msgpack.encode(vllm.kv.KVEventBatch(ts=0.0, events=[e]))).events[0] for e in events
    ]
    spaces = [[int(item["block_add"]["block_key"]) for item in oracle.stored(event)] for event in wire]
    assert spaces[0] == keys_from_tokens(tokens, 4)
    assert len({key for space in spaces for key in space}) == 10, "no two namespaces share a key"
    relay = start(http, vllm, context, **config)
    try:
        vllm.publish(*events)
        for space in spaces:
            visible(http, relay, space, {HOST: 2})
        vllm.publish(vllm.removed([1, 2]))
        visible(http, relay, spaces[0], {})
        assert all(hosts(http, space) == {HOST: 2} for space in spaces[1:])
    finally:
        relay.stop()
