"""The relay: one engine's (one DP rank's) KV-cache events in, reportEvent calls out.

It follows upstream's subscriber contract (``docs/design/cache_event_subscriber.md``):

- **One update in flight.** A single loop reads the engine's PUB socket, turns events into
  reportEvent items (``Translator``) and sends them (``Sender``), waiting for KVCM's answer
  before it reads on. The cursor (``RelayStats.cursor``) moves only when KVCM has
  acknowledged every item up to that sequence number. While KVCM does not answer the update
  is retried with capped backoff, never dropped; the engine's socket buffers meanwhile, and
  what it drops comes back from its replay socket as a gap.
- **An authoritative baseline.** On start, and whenever the engine restarts (its sequence
  numbers begin again at 0), the relay clears what KVCM holds for this reporter (HOST_DOWN,
  then NODE_REGISTER) and rebuilds from the replay buffer. The state is *complete* when
  the buffer reaches back to seq 0 or to an AllBlocksCleared.
- **Gaps.** A gap in the sequence numbers is filled from the replay socket. A gap it can no
  longer fill (its buffer is bounded) clears the reporter too, so that KVCM holds a true
  subset of the engine's blocks rather than blocks it may have evicted meanwhile; the relay
  is then *incomplete* (``/readyz`` says so) until the next AllBlocksCleared or restart.
- **Refusals.** INSTANCE_NOT_EXIST, PERMISSION_DENIED and UNAUTHENTICATED are permanent:
  logged as errors, readiness fails, and the update is retried slowly (an operator may
  register the instance). NODE_NOT_REGISTERED re-registers and sends again; items refused
  as invalid are dropped and counted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack
import urllib3
import zmq
from zmq.utils.monitor import recv_monitor_message

from chalicelib.protocol import block_keys
from chalicelib.protocol.block_keys import RollingHash, keys_from_tokens, scheme_from_text

from .kv_events import (
    DEFAULT_MEDIA,
    END_SEQ,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    MalformedBatchError,
    block_key,
    decode_batch,
    replay_frame,
    sequence_number,
)

log = logging.getLogger("kvcm.relay")
#: Engine block hashes remembered to chain token-derived keys (``keys="tokens"``).
PARENT_MEMORY = 1 << 20
#: Refusals no retry can cure: the operator must act (register the instance, fix the key).
PERMANENT_CODES = frozenset({"INSTANCE_NOT_EXIST", "PERMISSION_DENIED", "UNAUTHENTICATED"})
#: The KV-cache group kinds indexed by default (vLLM's ``KVCacheSpecKind`` values): full
#: attention, MLA included. Sliding-window, chunked-local and Mamba groups hold only a
#: suffix of a prefix, so their blocks cannot answer a prefix match.
FULL_ATTENTION_KINDS = ("full_attention", "mla_attention")


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
    #: The engine medium of events that name none.
    default_medium: str = "GPU"
    #: Engine medium → KVCM medium, over ``DEFAULT_MEDIA``; an empty value skips the medium.
    media: Mapping[str, str] = field(default_factory=dict)
    #: ``engine``: block keys are the engine's block hashes (their low 64 bits); ``tokens``:
    #: KVCM's keys of the blocks' token ids (``block_size`` must then be the instance's),
    #: seeded per namespace (LoRA adapter, cache salt, extra keys).
    keys: str = "engine"
    block_size: int = 0
    #: The KV-cache groups indexed: these ``group_idx`` when given, else the groups whose
    #: ``kv_cache_spec_kind`` is one of ``group_kinds``. Events without a group are indexed.
    groups: tuple[int, ...] = ()
    group_kinds: tuple[str, ...] = FULL_ATTENTION_KINDS
    #: The DP rank this relay reports (batches of another rank are refused); None: any.
    dp_rank: int | None = None
    #: How ``keys="tokens"`` derives them: the instance's ``key_scheme`` (a name or its JSON;
    #: empty: upstream's rolling hash).
    key_scheme: str = ""
    max_batch: int = 1000
    flush_interval_s: float = 0.05
    heartbeat_interval_s: float = 5.0
    stats_interval_s: float = 60.0
    retry_base_s: float = 0.1
    retry_max_s: float = 10.0
    replay_timeout_s: float = 2.0
    #: Messages the SUB socket queues while an update waits for KVCM (then the engine's PUB
    #: drops, and the replay socket fills the gap).
    receive_hwm: int = 100_000
    token: str = ""
    timeout_s: float = 5.0

    def kvcm_medium(self, engine_medium: str | None) -> str:
        """The KVCM medium of an engine medium ("" when it is not reported)."""
        name = (engine_medium or self.default_medium).upper()
        media = {**DEFAULT_MEDIA, **{k.upper(): v for k, v in self.media.items()}}
        return media.get(name, name.lower())

    def described(self) -> dict[str, object]:
        """The configuration as logged at start: the token is only said to be set."""
        shown = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "token"}
        shown["media"] = {**DEFAULT_MEDIA, **self.media}
        shown["token"] = "set" if self.token else "none"
        return shown


@dataclass
class RelayStats:
    """What the relay did; ``/metrics`` exports it (``connectors/sidecar.py``)."""

    batches: int = 0
    events: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0
    items_sent: int = 0
    requests: int = 0
    retries: int = 0
    replay_requests: int = 0
    replayed_batches: int = 0
    gaps: int = 0
    gaps_unfilled: int = 0
    epochs: int = 0
    clears: int = 0
    keys_unchained: int = 0
    #: The last sequence number KVCM acknowledged (-1: an empty baseline; None: none yet).
    cursor: int | None = None
    #: Seconds from the engine's batch timestamp to KVCM's acknowledgement, last update.
    lag_s: float = 0.0
    drops: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    complete: bool = False
    #: Why the relay is not ready, by cause ("" entries are removed).
    not_ready: dict[str, str] = field(default_factory=dict)

    def problem(self, cause: str, why: str | None) -> None:
        if why:
            self.not_ready[cause] = why
        else:
            self.not_ready.pop(cause, None)

    def summary(self) -> str:
        """One log line of counters (never a token id)."""
        return (
            f"batches={self.batches} events={self.events} stored={self.blocks_stored} "
            f"removed={self.blocks_removed} sent={self.items_sent} requests={self.requests} "
            f"retries={self.retries} replayed={self.replayed_batches} gaps={self.gaps} "
            f"unfilled={self.gaps_unfilled} epochs={self.epochs} cursor={self.cursor} "
            f"lag_s={self.lag_s:.3f} drops={dict(self.drops)} errors={dict(self.errors)} "
            f"complete={self.complete} not_ready={self.not_ready}"
        )


#: A reportEvent item, or a whole reportEvent body or answer, as JSON.
Item = dict[str, Any]


class TransportError(Exception):
    """KVCM did not answer usably (connection error, timeout, HTTP 429/5xx)."""


class Transport(Protocol):
    """Where reportEvent bodies go (``HttpTransport``; tests give the app's test client)."""

    def post(self, body: Item) -> Item:
        """KVCM's answer to ``body``; TransportError when there is none to use."""


class HttpTransport:
    """POSTs reportEvent bodies to KVCM over HTTP(S), with the engine's API key as bearer."""

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


HEARTBEAT = _item("EVENT_HEARTBEAT", "heartbeat", {})
HOST_DOWN = _item("EVENT_HOST_DOWN", "host_down", {})
_NAMESPACE_TAG = b"kvcm-relay-namespace-v1"


def _int64(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big", signed=True)


def namespace_seed(lora_name: str | None, cache_salt: str | None) -> int:
    """The parent key of a namespace's first block (``keys="tokens"``): 0 (upstream's keys
    of the tokens) without a namespace, else a digest of the adapter and the salt (with a
    presence byte and a length for each, so ("a", "bc") and ("ab", "c") differ)."""
    if lora_name is None and cache_salt is None:
        return 0
    digest = hashlib.sha256(_NAMESPACE_TAG)
    for part in (lora_name, cache_salt):
        if part is None:
            digest.update(b"\0")
        else:
            encoded = part.encode()
            digest.update(b"\1" + len(encoded).to_bytes(8, "big") + encoded)
    return _int64(digest.digest())


def _mix_extra_keys(parent: int, extra: object) -> int:
    """A block's parent key with the extra keys that entered its hash (multimodal inputs,
    salts, adapters) mixed in, so that equal tokens of different inputs get different keys."""
    if extra is None:
        return parent
    packed = msgpack.packb(extra, default=repr)
    return _int64(hashlib.sha256(_NAMESPACE_TAG + parent.to_bytes(8, "big", signed=True) + packed).digest())


class Translator:
    """Engine events → reportEvent items, for the groups and media the relay indexes."""

    def __init__(self, config: RelayConfig, stats: RelayStats) -> None:
        self.config = config
        self.stats = stats
        #: (group, engine hash) → KVCM hash (keys="tokens"); groups never chain into each other.
        self._kvcm_keys: OrderedDict[Hashable, block_keys.BlockHash] = OrderedDict()
        self._scheme = scheme_from_text(config.key_scheme)
        #: group_idx → whether it is indexed, learned from its BlockStored events' kind.
        self._group_indexed: dict[int, bool] = {}

    def reset(self) -> None:
        """Forget what the engine stored (a clear, a new epoch)."""
        self._kvcm_keys.clear()

    def _indexed(self, group: int | None, kind: str | None = None, stored: bool = False) -> bool:
        if group is None:
            return True
        if self.config.groups:
            return group in self.config.groups
        if stored:
            self._group_indexed[group] = kind is None or kind in self.config.group_kinds
        # a removal in a group never seen storing removes nothing the relay reported
        return self._group_indexed.get(group, False)

    def _specs(self, medium: str, key: int) -> list[dict[str, str]]:
        c = self.config
        return [
            {"name": spec, "uri": c.uri_template.format(host_ip_port=c.host_ip_port, medium=medium, key=key, spec=spec)}
            for spec in c.spec_names
        ]

    def _stored_keys(self, event: BlockStored) -> list[int | None]:
        if self.config.keys == "engine":
            return [block_key(h) for h in event.block_hashes]
        group = event.group_idx
        parent: block_keys.BlockHash | None = None
        if event.parent_block_hash is not None:
            parent = self._kvcm_keys.get((group, _hashable(event.parent_block_hash)))
            if parent is None:  # the prefix is unknown: its keys cannot be derived
                self.stats.keys_unchained += len(event.block_hashes)
                return [None] * len(event.block_hashes)
        hashes = self._chain(event, parent)[: len(event.block_hashes)]
        for engine_hash, kvcm_hash in zip(event.block_hashes, hashes, strict=False):
            self._kvcm_keys[(group, _hashable(engine_hash))] = kvcm_hash
            if len(self._kvcm_keys) > PARENT_MEMORY:
                self._kvcm_keys.popitem(last=False)
        # hashes cover the full blocks of the tokens only
        return [self._scheme.key(h) for h in hashes] + [None] * (len(event.block_hashes) - len(hashes))

    def _chain(self, event: BlockStored, parent: block_keys.BlockHash | None) -> list[block_keys.BlockHash]:
        """The KVCM hashes of an event's full blocks after ``parent`` (None: a first block).
        The engines' own schemes take the namespace from the instance's ``key_scheme`` (its
        LoRA and cache salt); upstream's rolling hash, the default, is seeded per namespace
        (adapter, cache salt) and mixed with each block's extra keys."""
        if not isinstance(self._scheme, RollingHash):
            return self._scheme.chain(event.token_ids, self.config.block_size, parent)
        size = self.config.block_size
        extras = event.extra_keys or []
        key = namespace_seed(event.lora_name, event.cache_salt) if parent is None else int(parent)
        hashes: list[block_keys.BlockHash] = []
        for i in range(len(event.token_ids) // size):
            extra = extras[i] if i < len(extras) else None
            key = keys_from_tokens(event.token_ids[i * size : (i + 1) * size], size, _mix_extra_keys(key, extra))[0]
            hashes.append(key)
        return hashes

    def _removed_key(self, group: int | None, engine_hash: BlockHash) -> int | None:
        if self.config.keys == "engine":
            return block_key(engine_hash)
        kvcm_hash = self._kvcm_keys.pop((group, _hashable(engine_hash)), None)
        return None if kvcm_hash is None else self._scheme.key(kvcm_hash)

    def stored(self, event: BlockStored) -> list[Item]:
        medium = self.config.kvcm_medium(event.medium)
        if not self._indexed(event.group_idx, event.kv_cache_spec_kind, stored=True):
            self.stats.drops["group not indexed"] += len(event.block_hashes)
            return []
        if not medium:
            self.stats.drops["medium not reported"] += len(event.block_hashes)
            return []
        self.stats.blocks_stored += len(event.block_hashes)
        return [
            _item(
                "EVENT_BLOCK_ADD",
                "block_add",
                {"block_key": str(key), "medium": medium, "specs": self._specs(medium, key)},
            )
            for key in self._stored_keys(event)
            if key is not None
        ]

    def removed(self, event: BlockRemoved) -> list[Item]:
        medium = self.config.kvcm_medium(event.medium)
        if not medium or not self._indexed(event.group_idx):
            return []
        keys = [self._removed_key(event.group_idx, h) for h in event.block_hashes]
        self.stats.blocks_removed += len(event.block_hashes)
        names = list(self.config.spec_names)
        return [
            _item("EVENT_BLOCK_DELETE", "block_delete", {"block_key": str(key), "medium": medium, "spec_names": names})
            for key in keys
            if key is not None
        ]

    def mediums(self) -> list[str]:
        """The KVCM media this relay may report (its NODE_REGISTER)."""
        names = {*DEFAULT_MEDIA, *(k.upper() for k in self.config.media), self.config.default_medium.upper()}
        return sorted({m for m in map(self.config.kvcm_medium, names) if m})


def _hashable(value: object) -> Hashable:
    return bytes(value) if isinstance(value, (bytes, bytearray, list)) else value


class StoppedError(Exception):
    """The relay stopped while an update waited for KVCM's acknowledgement."""


class Sender:
    """Delivers updates to KVCM with upstream's reportEvent contract: each one is retried
    until KVCM acknowledges it (or the relay stops)."""

    def __init__(
        self,
        config: RelayConfig,
        transport: Transport,
        stats: RelayStats,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        self.config = config
        self.transport = transport
        self.stats = stats
        #: Sleeps for the backoff; True when the relay is stopping.
        self.wait = wait or threading.Event().wait

    def _body(self, items: list[Item]) -> Item:
        c = self.config
        return {
            "trace_id": f"relay-{time.time_ns()}",
            "instance_id": c.instance_id,
            "host_ip_port": c.host_ip_port,
            "storage_type": c.storage_type,
            "events": items,
        }

    def _answer(self, items: list[Item]) -> Item:
        """KVCM's answer to ``items``, retried with capped backoff and jitter while KVCM does
        not answer, answers SERVICE_NOT_READY, or refuses permanently."""
        attempt = 0
        while True:
            if attempt:
                self.stats.retries += 1
                delay = min(self.config.retry_max_s, self.config.retry_base_s * 2 ** (attempt - 1))
                if self.wait(delay * (0.5 + random.random() / 2)):
                    raise StoppedError
            attempt += 1
            self.stats.requests += 1
            try:
                answer = self.transport.post(self._body(items))
            except TransportError as exc:
                self.stats.errors["unreachable"] += 1
                self.stats.problem("kvcm", f"KVCM unreachable: {exc}")
                log.warning("reportEvent failed (attempt %d): %s", attempt, exc)
                continue
            status = answer.get("header", {}).get("status", {})
            code = status.get("code", "")
            if code == "SERVICE_NOT_READY":
                self.stats.errors[code] += 1
                self.stats.problem("kvcm", f"KVCM answers {code}")
                continue
            if code in PERMANENT_CODES:
                self.stats.errors[code] += 1
                why = f"KVCM refuses instance {self.config.instance_id!r}: {code} {status.get('message', '')}"
                if self.stats.not_ready.get("refused") != why:
                    log.error("%s; retrying every %.0f s until the operator fixes it", why, self.config.retry_max_s)
                self.stats.problem("refused", why)
                continue
            self.stats.problem("kvcm", None)
            self.stats.problem("refused", None)
            return answer

    def host_down(self) -> None:
        """HOST_DOWN, acknowledged (a reporter KVCM does not know is down already)."""
        code = self._answer([HOST_DOWN])["header"]["status"]["code"]
        if code not in ("OK", "NODE_NOT_REGISTERED"):
            self.stats.errors[code] += 1
            log.error("HOST_DOWN refused: %s", code)

    def register(self, mediums: list[str]) -> None:
        self.deliver([_item("EVENT_NODE_REGISTER", "node_register", {"mediums": mediums})], register=None)

    def deliver(self, items: list[Item], register: Callable[[], None] | None) -> bool:
        """Send ``items`` until KVCM has answered each of them. NODE_NOT_REGISTERED items are
        sent again after ``register()``; True when that happened (KVCM had forgotten the
        reporter, and with it what was reported before)."""
        answer = self._answer(items)
        code = answer["header"]["status"]["code"]
        if code == "OK":
            self.stats.items_sent += len(items)
            return False
        results = answer.get("item_results") or [code] * len(items)
        results += [code] * (len(items) - len(results))
        again = [item for item, result in zip(items, results, strict=False) if result == "NODE_NOT_REGISTERED"]
        ok = sum(1 for r in results if r == "OK")
        self.stats.items_sent += ok
        refused = len(items) - ok - len(again)
        if refused:
            self.stats.drops[f"refused {code}"] += refused
            self.stats.errors[code] += 1
            log.error(
                "reportEvent refused %d of %d items: %s %s",
                refused,
                len(items),
                code,
                answer["header"]["status"].get("message", ""),
            )
        if again and register is not None:
            register()
            self.deliver(again, register=None)
            return True
        if again:
            self.stats.drops["not registered"] += len(again)
        return False


class Relay:
    """Subscribes to one engine publisher's KV events and reports them to KVCM until ``stop``."""

    def __init__(
        self,
        config: RelayConfig,
        endpoint: str,
        replay_endpoint: str = "",
        transport: Transport | None = None,
        context: zmq.Context[Any] | None = None,
        topic: bytes = b"",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.clock = clock
        self.wall_clock = wall_clock
        self.stats = RelayStats()
        self.translator = Translator(config, self.stats)
        self._stop = threading.Event()
        self.sender = Sender(config, transport or HttpTransport(config), self.stats, wait=self._stop.wait)
        self.context = context or zmq.Context.instance()
        #: The last sequence number taken in (-1: an empty baseline; None: no baseline yet).
        self.received: int | None = None
        #: The last sequence number the PUB socket delivered (it never goes back but on a restart).
        self.last_live: int | None = None
        self._pending: list[Item] = []
        self._pending_seq: int | None = None
        self._pending_ts = 0.0
        self._thread: threading.Thread | None = None
        self.subscribed = threading.Event()
        self.stats.problem("baseline", "no baseline yet: the engine's replay socket has not answered")

    # ------------------------------------------------------------ lifecycle

    def start(self) -> Relay:
        log.info("relay for %s config: %s", self.endpoint, json.dumps(self.config.described(), default=str))
        rank = self.config.dp_rank or 0
        self._thread = threading.Thread(target=self._run, name=f"kvcm-relay-{rank}", daemon=True)
        self._thread.start()
        threading.Thread(target=self._log_stats, name=f"kvcm-relay-stats-{rank}", daemon=True).start()
        return self

    def _log_stats(self) -> None:
        """The counters every ``stats_interval_s``, also while an update waits for KVCM."""
        while not self._stop.wait(self.config.stats_interval_s):
            log.info("relay stats (rank %d): %s", self.config.dp_rank or 0, self.stats.summary())

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop after the update in flight (waiting at most ``timeout_s`` for it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ------------------------------------------------------------ KVCM side

    def _register(self) -> None:
        self.sender.register(self.translator.mediums())

    def _deliver(self, items: list[Item]) -> None:
        if self.sender.deliver(items, register=self._register):
            # KVCM had unregistered the reporter (no heartbeat within its grace): what was
            # reported before is gone there, so only later blocks are known
            self._incomplete("KVCM had forgotten the reporter (heartbeats missed past its grace)")

    def _flush(self) -> None:
        """Send what is pending, in updates of ``max_batch`` items, each acknowledged before
        the next; the cursor moves after the last."""
        items, self._pending = self._pending, []
        for start in range(0, len(items), self.config.max_batch):
            self._deliver(items[start : start + self.config.max_batch])
        if self._pending_seq is not None:
            self.stats.cursor = self._pending_seq
            self.stats.lag_s = max(0.0, self.wall_clock() - self._pending_ts)
            self._pending_seq = None

    def _clear(self) -> None:
        """KVCM forgets this reporter's blocks (HOST_DOWN retires its generation), then the
        reporter registers again; what was pending belongs to the cleared state."""
        self._pending = []
        self.translator.reset()
        self.stats.clears += 1
        self.sender.host_down()
        self._register()

    def _incomplete(self, why: str) -> None:
        self.stats.complete = False
        self.stats.problem(
            "incomplete", f"incomplete: {why}; complete again at the engine's next AllBlocksCleared or restart"
        )
        log.error("the reported state is incomplete: %s", why)

    # ------------------------------------------------------------ engine side

    def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """The replay socket's batches from ``start`` on; None when it does not answer."""
        if not self.replay_endpoint:
            return None
        self.stats.replay_requests += 1
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.replay_endpoint)
        batches: list[tuple[int, bytes]] = []
        try:
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            while sock.poll(int(self.config.replay_timeout_s * 1000)):
                seq, payload = replay_frame(sock.recv_multipart())
                if seq == END_SEQ:
                    return batches
                batches.append((seq, payload))
        except MalformedBatchError as exc:
            self.stats.errors["malformed replay"] += 1
            log.error("replay answer: %s", exc)
        finally:
            sock.close()
        return None

    def _take(self, seq: int, payload: bytes) -> None:
        """One batch in order: its items join the pending update."""
        self.received = seq
        self._pending_seq = seq
        try:
            batch = decode_batch(payload)
        except MalformedBatchError as exc:
            self.stats.errors["malformed batch"] += 1
            log.error("batch %d: %s", seq, exc)
            return
        if self.config.dp_rank is not None and batch.data_parallel_rank not in (None, self.config.dp_rank):
            self.stats.errors["other dp rank"] += 1
            log.error(
                "batch %d is of DP rank %s, this relay reports rank %d",
                seq,
                batch.data_parallel_rank,
                self.config.dp_rank,
            )
            return
        self.stats.batches += 1
        self.stats.events += len(batch.events)
        for name in batch.unknown:
            self.stats.drops[f"unknown event {name}"] += 1
        self._pending_ts = batch.ts
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._pending += self.translator.stored(event)
            elif isinstance(event, BlockRemoved):
                self._pending += self.translator.removed(event)
            elif isinstance(event, AllBlocksCleared):
                self._clear()
                self._complete()

    def _disconnected(self) -> None:
        """The engine's PUB socket went away: whatever comes back (most likely a restarted
        engine, whose sequence numbers may pass the old ones before the SUB socket is
        connected again) is a new epoch, built from its replay socket."""
        if self.received is None:
            return
        self._flush()
        self.stats.epochs += 1
        self.received = self.last_live = None
        self.stats.problem("baseline", "the engine's PUB socket disconnected: waiting for its replay socket")
        log.warning("the engine's PUB socket disconnected: a new epoch begins when it answers again")

    def _complete(self) -> None:
        self.stats.complete = True
        self.stats.problem("incomplete", None)

    def _baseline(self, live: tuple[int, bytes] | None) -> bool:
        """Clear the reporter and rebuild it from the replay buffer (and ``live``, the
        message that showed a new epoch); False when there is nothing to build from yet."""
        replayed = self._replay(0)
        if replayed is None and live is None:
            return False
        batches = [b for b in replayed or [] if live is None or b[0] < live[0]] + ([live] if live else [])
        self._clear()
        self.stats.problem("baseline", None)
        self.received = -1
        if not batches or batches[0][0] == 0:
            self._complete()
        else:
            self._incomplete(f"the replay buffer starts at seq {batches[0][0]}, not 0")
        for seq, payload in batches:
            self._take(seq, payload)
        if not batches:
            self.stats.cursor = -1
        return True

    def _fill(self, seq: int, payload: bytes) -> None:
        """A message after a gap: the missed batches from the replay socket, then it."""
        assert self.received is not None
        self.stats.gaps += 1
        start = self.received + 1
        replayed = [b for b in self._replay(start) or [] if start <= b[0] < seq]
        if [s for s, _ in replayed] != list(range(start, seq)):
            self.stats.gaps_unfilled += 1
            self._clear()
            self._incomplete(f"batches {start}..{seq - 1} are no longer in the engine's replay buffer")
        else:
            self.stats.replayed_batches += len(replayed)
        for replayed_seq, replayed_payload in replayed:
            self._take(replayed_seq, replayed_payload)
        self._take(seq, payload)

    def _receive(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self.stats.errors["malformed message"] += 1
            return
        try:
            seq = sequence_number(frames[1])
        except MalformedBatchError:
            self.stats.errors["malformed message"] += 1
            return
        restarted = self.last_live is not None and seq <= self.last_live  # counting again
        self.last_live = seq
        if restarted:  # a new publisher counting from 0 again: a new epoch
            self.stats.epochs += 1
            log.warning("the engine restarted (seq %d after %d): a new epoch", seq, self.received)
            self._baseline((seq, frames[2]))
        elif self.received is None:
            self._baseline((seq, frames[2]))
        elif seq <= self.received:
            return  # taken already from the replay socket
        elif seq > self.received + 1:
            self._fill(seq, frames[2])
        else:
            self._take(seq, frames[2])

    # ------------------------------------------------------------ the loop

    def _run(self) -> None:
        sub = self.context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self.config.receive_hwm)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        sub.connect(self.endpoint)
        self.subscribed.set()
        now = self.clock()
        next_heartbeat = now + self.config.heartbeat_interval_s
        next_baseline = now
        flush_at: float | None = None
        try:
            while not self._stop.is_set():
                now = self.clock()
                if self.received is None and now >= next_baseline:
                    self._baseline(None)
                    next_baseline = now + self.config.replay_timeout_s
                wake = min(next_heartbeat, flush_at or next_heartbeat)
                ready = dict(
                    poller.poll(max(0, int((wake - self.clock()) * 1000)) if self.received is not None else 100)
                )
                if sub in ready:
                    while len(self._pending) < self.config.max_batch and sub.poll(0):
                        self._receive(sub.recv_multipart())
                if monitor in ready:  # after the messages the old connection delivered
                    recv_monitor_message(monitor)
                    self._disconnected()
                now = self.clock()
                if flush_at is None and self._pending_seq is not None:
                    flush_at = now + self.config.flush_interval_s
                if self._pending_seq is not None and (
                    len(self._pending) >= self.config.max_batch or (flush_at is not None and now >= flush_at)
                ):
                    self._flush()
                    flush_at = None
                if now >= next_heartbeat:
                    if self.received is not None:
                        self._deliver([HEARTBEAT])
                    next_heartbeat = now + self.config.heartbeat_interval_s
            if self._pending_seq is not None:
                self._flush()
        except StoppedError:
            pass
        except Exception:
            self.stats.errors["crashed"] += 1
            log.exception("the relay loop failed")
            raise
        finally:
            sub.disable_monitor()
            monitor.close()
            sub.close()
