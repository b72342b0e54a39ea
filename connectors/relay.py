"""The relay: an engine's KV-cache events in, batched reportEvent calls out.

One thread subscribes to the engine's ZMQ PUB socket, fills gaps in the sequence numbers
from its replay socket, and turns every event into reportEvent items (``Translator``);
another batches them (up to ``max_batch`` items or ``flush_interval_s``), adds a HEARTBEAT
every ``heartbeat_interval_s`` (ADD and DELETE do not keep a reporter alive) and sends them
(``Sender``): transport errors, HTTP 429/5xx and SERVICE_NOT_READY are retried with
exponential backoff and jitter; items refused with NODE_NOT_REGISTERED are sent again after
a NODE_REGISTER; items refused as invalid are dropped and counted. The queue between them
is bounded: when KVCM falls behind the subscriber waits, the engine's socket buffers and
then drops, and the dropped sequence numbers come back from the replay socket.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import urllib3
import zmq

from chalicelib.protocol.block_keys import BlockHash, scheme_from_text

from .kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    MalformedBatchError,
    block_key,
    decode_batch,
    sequence_number,
)

log = logging.getLogger("kvcm.relay")
#: Engine block hashes remembered to chain token-derived keys (``keys="tokens"``).
PARENT_MEMORY = 1 << 20


@dataclass(frozen=True)
class RelayConfig:
    manager_url: str
    instance_id: str
    host_ip_port: str
    storage_type: str = "ST_EVENT_REPORT_L1P5"
    #: The instance's location spec names every reported block carries.
    spec_names: tuple[str, ...] = ("full_0",)
    #: Each spec's URI; fields: host_ip_port, medium, key, spec.
    uri_template: str = "event_report://{host_ip_port}/{medium}/{key}?spec={spec}"
    default_medium: str = "gpu"
    #: ``engine``: block keys are the engine's block hashes (as int64); ``tokens``: KVCM's
    #: keys of the blocks' token ids (``block_size`` must then be the instance's).
    keys: str = "engine"
    block_size: int = 0
    #: How ``keys="tokens"`` derives them: the instance's ``key_scheme`` (a name or its JSON).
    key_scheme: str = ""
    max_batch: int = 1000
    flush_interval_s: float = 0.05
    heartbeat_interval_s: float = 5.0
    max_pending: int = 100_000
    max_retries: int = 5
    retry_base_s: float = 0.1
    replay_timeout_s: float = 2.0
    token: str = ""
    timeout_s: float = 5.0


@dataclass
class RelayStats:
    batches_received: int = 0
    events_received: int = 0
    items_sent: int = 0
    items_dropped: int = 0
    requests: int = 0
    retries: int = 0
    replayed: int = 0
    gaps_lost: int = 0
    keys_unchained: int = 0
    errors: list[str] = field(default_factory=list)


#: A reportEvent item, or a whole reportEvent body or answer, as JSON.
Item = dict[str, Any]


class TransportError(Exception):
    """KVCM did not answer usably (connection error, timeout, HTTP 429/5xx)."""


class Transport(Protocol):
    """Where reportEvent bodies go (``HttpTransport``; tests give a recorder)."""

    def post(self, body: Item) -> Item:
        """KVCM's answer to ``body``; TransportError when there is none to use."""


class HttpTransport:
    """POSTs reportEvent bodies to KVCM over HTTP(S)."""

    def __init__(self, config: RelayConfig) -> None:
        self.url = config.manager_url.rstrip("/") + "/api/reportEvent"
        self.headers = {"Content-Type": "application/json"}
        if config.token:
            self.headers["Authorization"] = f"Bearer {config.token}"
        self.pool = urllib3.PoolManager(timeout=urllib3.Timeout(total=config.timeout_s), retries=False)

    def post(self, body: Item) -> Item:
        try:
            resp = self.pool.request("POST", self.url, body=json.dumps(body).encode(), headers=self.headers)
        except urllib3.exceptions.HTTPError as exc:
            raise TransportError(str(exc)) from exc
        if resp.status == 429 or resp.status >= 500:
            raise TransportError(f"HTTP {resp.status}")
        try:
            answer: Item = json.loads(resp.data)
        except ValueError as exc:
            raise TransportError(f"HTTP {resp.status}: not JSON") from exc
        return answer


def _item(event_type: str, member: str, payload: Item) -> Item:
    return {"event_type": event_type, member: payload}


REGISTER_TYPE, HOST_DOWN_TYPE = "EVENT_NODE_REGISTER", "EVENT_HOST_DOWN"
HEARTBEAT = _item("EVENT_HEARTBEAT", "heartbeat", {})
HOST_DOWN = _item(HOST_DOWN_TYPE, "host_down", {})


class Translator:
    """Engine events → reportEvent items."""

    def __init__(self, config: RelayConfig, stats: RelayStats) -> None:
        self.config = config
        self.stats = stats
        self._kvcm_keys: OrderedDict[Hashable, BlockHash] = OrderedDict()  # engine hash → KVCM hash (keys="tokens")
        self._scheme = scheme_from_text(config.key_scheme)

    def _specs(self, medium: str, key: int) -> list[dict[str, str]]:
        c = self.config
        return [
            {"name": spec, "uri": c.uri_template.format(host_ip_port=c.host_ip_port, medium=medium, key=key, spec=spec)}
            for spec in c.spec_names
        ]

    def _stored_keys(self, event: BlockStored) -> list[int | None]:
        if self.config.keys == "engine":
            return [block_key(h) for h in event.block_hashes]
        parent = None
        if event.parent_block_hash is not None:
            known = self._kvcm_keys.get(_hashable(event.parent_block_hash))
            if known is None:  # the prefix is unknown: its keys cannot be derived
                self.stats.keys_unchained += len(event.block_hashes)
                return [None] * len(event.block_hashes)
            parent = known
        hashes = self._scheme.chain(event.token_ids, self.config.block_size, parent)
        # hashes cover the full blocks of the tokens only
        for engine_hash, kvcm_hash in zip(event.block_hashes, hashes, strict=False):
            self._kvcm_keys[_hashable(engine_hash)] = kvcm_hash
            if len(self._kvcm_keys) > PARENT_MEMORY:
                self._kvcm_keys.popitem(last=False)
        return [self._scheme.key(h) for h in hashes] + [None] * (len(event.block_hashes) - len(hashes))

    def _removed_key(self, engine_hash: object) -> int | None:
        if self.config.keys == "engine":
            return block_key(engine_hash)
        kvcm_hash = self._kvcm_keys.pop(_hashable(engine_hash), None)
        return None if kvcm_hash is None else self._scheme.key(kvcm_hash)

    def translate(self, event: KVEvent) -> list[Item]:
        medium = (getattr(event, "medium", None) or self.config.default_medium).lower()
        if isinstance(event, BlockStored):
            return [
                _item(
                    "EVENT_BLOCK_ADD",
                    "block_add",
                    {"block_key": str(key), "medium": medium, "specs": self._specs(medium, key)},
                )
                for key in self._stored_keys(event)
                if key is not None
            ]
        if isinstance(event, BlockRemoved):
            keys = [self._removed_key(h) for h in event.block_hashes]
            return [
                _item(
                    "EVENT_BLOCK_DELETE",
                    "block_delete",
                    {"block_key": str(key), "medium": medium, "spec_names": list(self.config.spec_names)},
                )
                for key in keys
                if key is not None
            ]
        if isinstance(event, AllBlocksCleared):
            self._kvcm_keys.clear()
            return [HOST_DOWN]  # then a NODE_REGISTER: the reporter starts empty
        return []


def _hashable(value: object) -> Hashable:
    return bytes(value) if isinstance(value, (bytes, bytearray, list)) else value


class Sender:
    """Sends items to KVCM with upstream's reportEvent contract, retrying what may be retried."""

    def __init__(
        self, config: RelayConfig, transport: Transport, stats: RelayStats, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.config = config
        self.transport = transport
        self.stats = stats
        self.sleep = sleep

    def _body(self, items: list[Item]) -> Item:
        c = self.config
        return {
            "trace_id": f"relay-{time.time_ns()}",
            "instance_id": c.instance_id,
            "host_ip_port": c.host_ip_port,
            "storage_type": c.storage_type,
            "events": items,
        }

    def _post(self, items: list[Item]) -> Item | None:
        """The answer to ``items``, retried on transport errors and SERVICE_NOT_READY; None
        when every attempt failed."""
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                self.stats.retries += 1
                self.sleep(self.config.retry_base_s * 2 ** (attempt - 1) * (1 + random.random()))
            self.stats.requests += 1
            try:
                answer = self.transport.post(self._body(items))
            except TransportError as exc:
                log.warning("reportEvent failed: %s", exc)
                continue
            if answer.get("header", {}).get("status", {}).get("code") != "SERVICE_NOT_READY":
                return answer
        return None

    def register(self) -> bool:
        mediums = [self.config.default_medium.lower()]
        answer = self._post([_item(REGISTER_TYPE, "node_register", {"mediums": mediums})])
        return answer is not None and answer["header"]["status"]["code"] == "OK"

    def send(self, items: list[Item], registered_again: bool = False) -> None:
        answer = self._post(items)
        if answer is None:
            self.stats.items_dropped += len(items)
            self.stats.errors.append("KVCM unreachable")
            return
        code = answer["header"]["status"]["code"]
        results = answer.get("item_results") or [code] * len(items)
        if code == "OK":
            self.stats.items_sent += len(items)
            return
        # one result per item; a short answer leaves the rest counted lost
        again = [item for item, result in zip(items, results, strict=False) if result == "NODE_NOT_REGISTERED"]
        self.stats.items_sent += sum(1 for r in results if r == "OK")
        lost = len(items) - len(again) - sum(1 for r in results if r == "OK")
        if lost:
            self.stats.items_dropped += lost
            self.stats.errors.append(f"{code}: {answer['header']['status'].get('message', '')}")
        if again and not registered_again and self.register():
            self.send(again, registered_again=True)
        elif again:
            self.stats.items_dropped += len(again)


class Relay:
    """Subscribes to an engine's KV events and reports them to KVCM until ``stop``."""

    def __init__(
        self,
        config: RelayConfig,
        endpoint: str,
        replay_endpoint: str = "",
        transport: Transport | None = None,
        context: zmq.Context[Any] | None = None,
        topic: bytes = b"",
    ) -> None:
        self.config = config
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.stats = RelayStats()
        self.translator = Translator(config, self.stats)
        self.sender = Sender(config, transport or HttpTransport(config), self.stats)
        self.context = context or zmq.Context.instance()
        self.queue: queue.Queue[Item] = queue.Queue(maxsize=config.max_pending)
        self.last_seq: int | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.subscribed = threading.Event()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> Relay:
        if not self.sender.register():
            log.warning("NODE_REGISTER failed; the first report registers the reporter")
        for target, name in ((self._subscribe, "kvcm-relay-sub"), (self._send_loop, "kvcm-relay-send")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, drain_s: float = 5.0) -> None:
        """Stop subscribing, send what is queued (for up to ``drain_s``), stop."""
        deadline = time.monotonic() + drain_s
        self._stop.set()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------ subscriber

    def _enqueue(self, items: list[Item]) -> None:
        for item in items:
            while not self._stop.is_set():  # backpressure: wait for the sender
                try:
                    self.queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue

    def _handle(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except MalformedBatchError as exc:
            self.stats.errors.append(str(exc))
            return
        self.stats.batches_received += 1
        self.stats.events_received += len(batch.events)
        for event in batch.events:
            self._enqueue(self.translator.translate(event))
        self.last_seq = seq

    def _replay(self, start: int, upto: int) -> None:
        """Ask the replay socket for ``start``.. (``upto`` is the message that showed the
        gap); what it no longer has is counted lost."""
        assert self.last_seq is not None, "a gap shows only after a first message"
        if self.replay_endpoint:
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.replay_endpoint)
            try:
                sock.send_multipart([b"", start.to_bytes(8, "big")])
                while sock.poll(int(self.config.replay_timeout_s * 1000)):
                    frames = sock.recv_multipart()
                    seq = sequence_number(frames[-2])
                    if seq == END_SEQ or seq >= upto:
                        break
                    if seq > self.last_seq:
                        self.stats.replayed += 1
                        self._handle(seq, frames[-1])
            finally:
                sock.close()
        self.stats.gaps_lost += upto - 1 - self.last_seq
        self.last_seq = upto - 1

    def _subscribe(self) -> None:
        sock = self.context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic)
        sock.connect(self.endpoint)
        self.subscribed.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(100):
                    continue
                frames = sock.recv_multipart()
                if len(frames) != 3:
                    self.stats.errors.append(f"a message of {len(frames)} frames, not (topic, seq, payload)")
                    continue
                seq = sequence_number(frames[1])
                if self.last_seq is not None and seq <= self.last_seq:
                    continue  # already seen (a replay overtook it)
                if self.last_seq is not None and seq > self.last_seq + 1:
                    self._replay(self.last_seq + 1, seq)
                self._handle(seq, frames[2])
        finally:
            sock.close()

    # ------------------------------------------------------------ sender

    def _send_loop(self) -> None:
        last_heartbeat = time.monotonic()
        while True:
            items: list[Item] = []
            deadline = time.monotonic() + self.config.flush_interval_s
            while len(items) < self.config.max_batch:
                try:
                    item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item["event_type"] == HOST_DOWN_TYPE:  # must travel alone, then re-register
                    if items:
                        self.sender.send(items)
                        items = []
                    self.sender.send([item])
                    self.sender.register()
                    continue
                items.append(item)
            if time.monotonic() - last_heartbeat >= self.config.heartbeat_interval_s:
                items.append(HEARTBEAT)
                last_heartbeat = time.monotonic()
            if items:
                self.sender.send(items)
            elif self._stop.is_set() and self.queue.empty():
                return
