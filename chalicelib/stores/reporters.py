"""Engine-reported locations and reporter state in Valkey (reportEvent, UPSTREAM_V2 §2.1).

Upstream keeps reporter state in one process's memory; KVCM's containers are stateless,
so it lives here, beside the instance's block index under the same hash tag
``{<prefix>:<instance>}`` (one cluster slot), and every change is one Lua script
(``lua/er_*.lua``, with ``lua/er_prelude.lua`` describing the encoding):

- ``T:er:r:<rid>``      hash: block key → that reporter's record of the key (its locations
                        per medium, the generation they were written in)
- ``T:er:bits``         hash: block key → bitmap of the *slots* (reporter, generation, medium
                        and spec names) holding the key: getHostCacheState's prefix walk reads one short
                        value per key, never a record
- ``T:er:slots:free``, ``T:er:slots:next``  the slot numbers freed by cleanup, and the next new one
- ``T:er:n:<rid>``      hash: one reporter's state (registration, heartbeat, generations, slots)
- ``T:er:nodes``        set: the instance's reporters (rid = ``<l1p5|l2>#<host_ip_port>``)
- ``T:er:view``         hash: rid → a registered reporter's heartbeat and visible slots, rewritten
                        by every script that changes its state: readers take all reporters in
                        one call
- ``{<prefix>:er}:instances``  set: instances with reporters (the liveness job's work list)

A record carries its reporter's generation token at the time, which readers append to every
URI (``s_version=<32 hex>``). A full snapshot starts a new generation and makes the reporter
strict (only the committed generation is visible); HOST_DOWN, the end of the cleanup grace
and a snapshot retire the older generations, which hides them at once (their slots leave
every reader's mask); ``cleanup`` then deletes their records and bits in batches and frees
their slots.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import groupby
from pathlib import Path
from typing import Any, cast

import msgspec
from redis.exceptions import NoScriptError

from .. import resp as replies
from ..protocol.codes import ErrorCode, StorageType
from ..resp import EXEC, MULTI, command
from ..valkey import Valkey, exchange, follow_moved, lua_source, valkey_errors
from .host_walk import HostWalk

LUA_DIR = Path(__file__).with_name("lua")
RID_TYPES = {StorageType.ST_EVENT_REPORT_L1P5: "l1p5", StorageType.ST_EVENT_REPORT_L2: "l2"}
#: Keys per cleanup script call.
CLEANUP_BATCH = 1000

#: One event as the report script reads it (the ``*_event`` functions make them).
Event = tuple[Any, ...]


#: The item codes the scripts return, declared to them as Lua constants (``lua_codes``).
SCRIPT_CODES = (ErrorCode.OK, ErrorCode.NODE_NOT_REGISTERED, ErrorCode.SNAPSHOT_RATE_LIMITED)


def lua_codes() -> str:
    """``SCRIPT_CODES`` as Lua ``local`` constants named as the members, prepended to every
    event-report script: the scripts' codes are the wire's by construction."""
    names = ", ".join(code.name for code in SCRIPT_CODES)
    values = ", ".join(str(code.value) for code in SCRIPT_CODES)
    return f"-- Generated from chalicelib/stores/reporters.py when the script is loaded.\nlocal {names} = {values}\n"


def _load(name: str) -> str:
    return lua_codes() + lua_source(LUA_DIR, name, prelude="er_prelude")


def new_token() -> str:
    """A fresh generation token: 32 hex characters, compared by equality only."""
    return os.urandom(16).hex()


def reporter_id(storage_type: StorageType, host_ip_port: str) -> str:
    return f"{RID_TYPES[storage_type]}#{host_ip_port}"


def location_id(rid: str, medium: str) -> str:
    """Upstream's stable location id of a reporter's medium: ``kvs#event_report_<type>#<medium>#<host>``."""
    kind, _, host = rid.partition("#")
    return f"kvs#event_report_{kind}#{medium}#{host}"


def block_field(key: int) -> bytes:
    """A block key as the hashes' field: 8 bytes, big-endian two's complement."""
    return key.to_bytes(8, "big", signed=True)


def block_fields(keys: Sequence[int]) -> bytes:
    """Block keys as one argument, 8 bytes each (``block_field``): readers split it as far as
    they walk, and a 20,000-key prompt is one argument to send instead of 20,000."""
    return struct.pack(f">{len(keys)}q", *keys)


#: msgpack headers of a fixarray by length, and of a string (fixstr, str 8) by length.
_FIXARRAY = [bytes([0x90 | n]) for n in range(16)]
_STR_HEADERS = [bytes([0xA0 | n]) for n in range(32)] + [b"\xd9" + bytes((n,)) for n in range(32, 256)]
#: A block key's field packed as a msgpack string: its header (8 bytes: a fixstr).
_FIELD_HEADER = _STR_HEADERS[8]


#: One block key's field as a RESP argument: ``$8``, its 8 bytes (``block_field``), CRLF.
_FIELD_ARG = b"$8\r\n" + bytes(8) + b"\r\n"


#: Fields per HMGET: ElastiCache Serverless refuses a request of more than 3,999 arguments.
HMGET_MAX_FIELDS = 3_997


def hmget_fields(hash_key: bytes, keys: Sequence[int]) -> list[bytes]:
    """``HMGET hash_key <the keys' fields>`` in RESP, one command per ``HMGET_MAX_FIELDS``
    keys: the fields are copied into a template by strided slice assignments (C loops, no
    object per key; 20,000 keys in about 0.3 ms where redis-py's command packing builds
    several objects per argument)."""
    commands = []
    for start in range(0, len(keys), HMGET_MAX_FIELDS):
        chunk = keys[start : start + HMGET_MAX_FIELDS]
        n = len(chunk)
        fields = block_fields(chunk)
        args = bytearray(_FIELD_ARG * n)
        for i in range(8):
            args[4 + i :: 14] = fields[i::8]
        commands.append(b"".join((b"*%d\r\n$5\r\nHMGET\r\n$%d\r\n%s\r\n" % (n + 2, len(hash_key), hash_key), args)))
    return commands


def _array_header(n: int) -> bytes:
    return _FIXARRAY[n] if n < 16 else b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")


def _str_header(size: int) -> bytes:
    if size < 256:
        return _STR_HEADERS[size]
    return b"\xda" + size.to_bytes(2, "big") if size < 1 << 16 else b"\xdb" + size.to_bytes(4, "big")


def pack_strings(items: Sequence[str | bytes]) -> bytes:
    """A msgpack array of strings, as the scripts store and unpack them (cmsgpack): built
    here so that a new key's record is the request's bytes behind the generation."""
    out = [_array_header(len(items))]
    append = out.append
    for item in items:
        data = item.encode() if isinstance(item, str) else item
        append(_str_header(len(data)))
        append(data)
    return b"".join(out)


#: msgpack of a location: msgspec's C encoder packs a list of strings as cmsgpack and
#: ``pack_strings`` do (str 8/16/32 by length), at a third of the latter's cost.
_PACK = msgspec.msgpack.Encoder().encode
#: lua/er_host_state.lua's answer: [host, slot, signature] per visible slot of a live reporter.
_VISIBLE_SLOTS = msgspec.msgpack.Decoder(list[tuple[str, int, list[str]]]).decode

#: getHostCacheState reads a prompt of more than ``HOST_STATE_SPLIT`` keys in its first
#: ``HOST_STATE_FIRST_PART`` keys first: a prompt that no host holds that far (a new prompt,
#: the common miss) is answered from them, the rest unread (20,000 keys nobody holds past
#: key 100: 1.4 ms instead of 10.7 on the 2-core bench machine); one held past them is read
#: again whole (about 1 ms more at 20,000 keys; a shorter prompt is read whole at once).
#: docs/api-v2.md, "The walk out of Lua", has the figures.
HOST_STATE_SPLIT, HOST_STATE_FIRST_PART = 1024, 256


def location_fields(medium: str, names: Sequence[str], uris: Sequence[str]) -> list[str]:
    """A location as records hold it, unpacked: [medium, name, uri, name, uri, ...]."""
    flat = [medium]
    for name, uri in zip(names, uris, strict=True):
        flat += (name, uri)
    return flat


def _location(medium: str, names: Sequence[str], uris: Sequence[str]) -> bytes:
    """A location as records hold it: msgpack [medium, name, uri, name, uri, ...]."""
    return _PACK(location_fields(medium, names, uris))


@lru_cache(maxsize=1024)
def _signature_of(medium: str, names: tuple[str, ...]) -> bytes:
    return pack_strings([medium, *names])


def _signature(medium: str, specs: Sequence[tuple[str, str]]) -> bytes:
    """What a location's slot stands for besides reporter and generation: its medium and
    spec names, in order (lua/er_prelude.lua er_signature); a batch's events mostly share one."""
    return _signature_of(medium, tuple(name for name, _ in specs))


# Events as the report script reads them (lua/er_report.lua); ``ReporterStore.report`` lays
# them out flat.
def register_event(mediums: Sequence[str]) -> Event:
    return ("r", list(mediums))


def heartbeat_event() -> Event:
    return ("h",)


def host_down_event() -> Event:
    return ("x",)


def add_event(block_key: int, medium: str, specs: Sequence[tuple[str, str]]) -> Event:
    return add_event_of(block_key, medium, tuple(name for name, _ in specs), [uri for _, uri in specs])


def add_event_of(block_key: int, medium: str, names: tuple[str, ...], uris: Sequence[str]) -> Event:
    """``add_event`` of specs given as their names and URIs."""
    return add_event_at(block_key, names, location_fields(medium, names, uris))


def add_event_at(block_key: int, names: tuple[str, ...], location: list[str]) -> Event:
    """``add_event`` of a location given as ``location_fields`` (``names``: its spec names):
    the request path's. The event carries its key and location packed already as the two
    strings of an ADD run."""
    packed = _PACK(location)
    field = block_key.to_bytes(8, "big", signed=True)  # block_field
    size = len(packed)
    header = _STR_HEADERS[size] if size < 256 else _str_header(size)
    return ("a", field, _signature_of(location[0], names), b"".join((_FIELD_HEADER, field, header, packed)))


def delete_event(block_key: int, medium: str, spec_names: Sequence[str]) -> Event:
    return ("d", block_field(block_key), medium, pack_strings(spec_names))


def snapshot_event(blocks: Sequence[tuple[int, str, Sequence[tuple[str, str]]]]) -> Event:
    return (
        "s",
        [
            (
                block_field(key),
                _signature(medium, specs),
                _location(medium, [n for n, _ in specs], [u for _, u in specs]),
            )
            for key, medium, specs in blocks
        ],
    )


def _keys_distinct(events: Sequence[Event]) -> bool:
    """Whether no block key is named twice by ``events`` (the script then keeps no per-key
    state for later events of the request)."""
    keys: list[bytes] = []
    for event in events:
        if event[0] in ("a", "d"):
            keys.append(event[1])
        elif event[0] == "s":
            keys += [block[0] for block in event[1]]
    return len(set(keys)) == len(keys)


def _flatten(events: Sequence[Event]) -> list[str | bytes | int]:
    """The script's arguments for ``events``: consecutive ADDs of one signature (medium and
    spec names) become one run (``'a', signature, n, [key, loc, ...]``), its keys and
    locations one msgpack array: Valkey parses a 1,000-event run as one argument, not 2,000
    (a snapshot's blocks likewise: ``'s', n, [key, signature, loc, ...]``)."""
    flat: list[str | bytes | int] = []
    for (op, signature), run in groupby(events, key=lambda e: (e[0], e[2] if e[0] == "a" else b"")):
        if op == "a":  # each event's key and location are packed already (add_event_of)
            packed = [event[3] for event in run]
            flat += ["a", signature, len(packed), _array_header(2 * len(packed)) + b"".join(packed)]
            continue
        for event in run:
            if op == "r":
                flat += ["r", len(event[1]), *event[1]]
            elif op == "d":
                flat += list(event)
            elif op == "s":
                flat += ["s", len(event[1]), pack_strings([part for block in event[1] for part in block])]
            else:
                flat.append(op)
    return flat


def versioned_uri(uri: str, version: str) -> str:
    """``uri`` with the generation appended as ``s_version`` (as readers print it)."""
    return f"{uri}{'&' if '?' in uri else '?'}s_version={version}"


@dataclass(frozen=True)
class Liveness:
    """An event-report storage's settings, in ms (EventReportStorageSpec with defaults)."""

    heartbeat_timeout_ms: int = 30_000
    cleanup_grace_ms: int = 300_000
    snapshot_min_interval_ms: int = 30_000


@dataclass(frozen=True)
class ReportOutcome:
    """What one report did: a code per event, the generation token after it (``""``: none),
    whether the reporter had no generation, the snapshot retry delay, and the retired
    tokens whose metadata awaits cleanup."""

    codes: list[ErrorCode]
    generation: str
    snapshot_required: bool
    retry_after_ms: int
    retired: str


@dataclass(frozen=True)
class ReporterState:
    rid: str
    registered: bool
    last_heartbeat_ms: int
    retired: str

    @property
    def host_ip_port(self) -> str:
        return self.rid.partition("#")[2]


class ReporterStore:
    """Reporter state and reported locations of every instance."""

    def __init__(self, client: Valkey, prefix: str = "kvcm") -> None:
        self.client = client
        self.prefix = prefix
        self._report = client.register_script(_load("er_report"))
        host_state = _load("er_host_state")
        self._host_state = client.register_script(host_state)
        # host_prefixes sends the script by its SHA inside a transaction: the store's first
        # read loads it in the same round trip (SCRIPT LOAD before MULTI), so that no
        # transaction runs its HMGET for nothing on a server without it.
        self._host_state_load = command(b"SCRIPT", b"LOAD", host_state.encode())
        self._host_state_loaded = False
        self._cleanup = client.register_script(_load("er_cleanup"))
        self._retired = client.register_script(_load("er_retired"))
        self._dump = client.register_script(_load("er_dump"))
        self._visible = client.register_script(_load("er_locations"))
        self._resync = client.register_script(_load("er_resync"))

    # ------------------------------------------------------------ key names

    def _tag(self, instance_id: str) -> str:
        return f"{{{self.prefix}:{instance_id}}}"

    def records_key(self, instance_id: str, rid: str) -> str:
        return f"{self._tag(instance_id)}:er:r:{rid}"

    def bits_key(self, instance_id: str) -> str:
        return f"{self._tag(instance_id)}:er:bits"

    def _slot_keys(self, instance_id: str) -> list[str]:
        """The free-slot zset and the next-slot counter."""
        return [f"{self._tag(instance_id)}:er:slots:free", f"{self._tag(instance_id)}:er:slots:next"]

    def node_key(self, instance_id: str, rid: str) -> str:
        return f"{self._tag(instance_id)}:er:n:{rid}"

    def nodes_key(self, instance_id: str) -> str:
        return f"{self._tag(instance_id)}:er:nodes"

    def view_key(self, instance_id: str) -> str:
        """The readers' view of the instance's registered reporters (lua/er_prelude.lua)."""
        return f"{self._tag(instance_id)}:er:view"

    @property
    def instances_key(self) -> str:
        return f"{{{self.prefix}:er}}:instances"

    # ------------------------------------------------------------ writes

    def report(
        self,
        instance_id: str,
        rid: str,
        events: Sequence[Event],
        now_ms: int,
        liveness: Liveness,
        token: str | None = None,
    ) -> ReportOutcome:
        """Apply ``events`` (the ``*_event`` encodings, already validated) in order, atomically.
        Valkey not answering (a long script past the socket timeout included) raises
        ValkeyUnavailableError (SERVICE_NOT_READY), as the reads do."""
        args = [
            rid,
            now_ms,
            token or new_token(),
            liveness.snapshot_min_interval_ms,
            liveness.heartbeat_timeout_ms,
            liveness.cleanup_grace_ms,
            "1" if _keys_distinct(events) else "0",
            *_flatten(events),
        ]
        keys = [
            self.node_key(instance_id, rid),
            self.records_key(instance_id, rid),
            self.bits_key(instance_id),
            self.nodes_key(instance_id),
            *self._slot_keys(instance_id),
            self.view_key(instance_id),
        ]
        with valkey_errors("reporter store"):
            codes, generation, required, retry_after, retired, joined = self._report(keys=keys, args=args)
            if joined:  # the liveness job's work list: an instance enters it with its first reporter
                self.client.sadd(self.instances_key, instance_id)
        results = [ErrorCode(int(codes[i])) for i in range(0, len(codes), 2) for _ in range(int(codes[i + 1]))]
        return ReportOutcome(results, generation.decode(), bool(required), int(retry_after), retired.decode())

    def expire(self, instance_id: str, rid: str, now_ms: int, liveness: Liveness) -> ReportOutcome:
        """Unregister the reporter if it is past its heartbeat timeout and grace (the
        report script does that first, whatever it is given)."""
        return self.report(instance_id, rid, [], now_ms, liveness)

    def cleanup(self, instance_id: str, rid: str, retired: str) -> int:
        """Delete the records and bits of the ``retired`` generations of one reporter, in
        batches of its keys; then forget those tokens and free their slots. Returns the
        locations removed."""
        removed = 0
        records = self.records_key(instance_id, rid)
        keys = [self.node_key(instance_id, rid), records, self.bits_key(instance_id)]
        cursor = 0
        while True:
            cursor, batch = self.client.hscan(records, cursor, count=CLEANUP_BATCH, no_values=True)
            if batch:
                removed += int(self._cleanup(keys=keys, args=[retired, *batch]))
            if cursor == 0:
                break
        self._retired(
            keys=[self.node_key(instance_id, rid), self._slot_keys(instance_id)[0], self.view_key(instance_id)],
            args=[retired, rid],
        )
        return removed

    def drop_legacy_layout(self, instance_id: str) -> list[str]:
        """Delete what an instance's reporters reported under the layout before per-reporter
        records (one ``T:er:loc`` hash of every reporter's locations and a key set per
        reporter), which no reader looks at, and retire each reporter's current generation so
        that its next report asks it for a snapshot: the engine then re-sends what it holds
        into the current layout. Returns the reporters asked (none when no such hash exists).

        A conversion in place would race the engines' DELETEs (a block deleted through the
        current layout, then copied over from the old hash, would come back); a snapshot is
        what upstream's reporters send whenever the manager has lost their state."""
        tag = self._tag(instance_id)
        if not self.client.exists(f"{tag}:er:loc"):
            return []
        view = self.view_key(instance_id)
        asked = [
            rid
            for rid in self.reporters(instance_id)
            if self._resync(keys=[self.node_key(instance_id, rid), view], args=[rid])
        ]
        self.client.unlink(f"{tag}:er:loc", *(f"{tag}:er:k:{rid}" for rid in self.reporters(instance_id)))
        return asked

    def forget_instance(self, instance_id: str) -> None:
        """Delete everything reported for an instance that no longer exists (UNLINK: large
        hashes are freed in the background)."""
        keys = [
            self.bits_key(instance_id),
            self.nodes_key(instance_id),
            self.view_key(instance_id),
            *self._slot_keys(instance_id),
        ]
        for rid in self.reporters(instance_id):
            keys += [self.node_key(instance_id, rid), self.records_key(instance_id, rid)]
        self.client.unlink(*keys)
        self.client.srem(self.instances_key, instance_id)

    # ------------------------------------------------------------ reads

    def reporters(self, instance_id: str) -> list[str]:
        return sorted(m.decode() for m in cast(set[bytes], self.client.smembers(self.nodes_key(instance_id))))

    def reporter(self, instance_id: str, rid: str) -> ReporterState | None:
        reg, hb, ret = cast(
            list[bytes | None], self.client.hmget(self.node_key(instance_id, rid), ["reg", "hb", "ret"])
        )
        if reg is None:
            return None
        return ReporterState(rid, reg == b"1", int(hb or 0), (ret or b"").decode())

    def instances(self) -> list[str]:
        return sorted(m.decode() for m in cast(set[bytes], self.client.smembers(self.instances_key)))

    def host_prefixes(
        self,
        instance_id: str,
        keys: Sequence[int],
        now_ms: int,
        timeouts: dict[str, int],
        mediums: Sequence[str] = (),
        mamba: tuple[Sequence[str], Sequence[str]] | None = None,
        eagle_pop: bool = False,
    ) -> dict[str, int]:
        """host_ip_port → the length of its prefix of ``keys`` over visible reported
        locations (hosts without one left out). ``timeouts``: reporter kind (``l1p5``,
        ``l2``) → heartbeat timeout ms (reporters of other kinds are hidden). ``mamba``:
        (full-attention spec names, state spec names) for QT_PREFIX_MATCH_WITH_MAMBA.

        One transaction a read: the reporters' visible slots (lua/er_host_state.lua) and an
        HMGET of the keys' bitmaps, walked here (host_walk.py). A prompt longer than
        ``HOST_STATE_SPLIT`` keys is read in its first part first; when a host holds past
        it, the whole prompt is read in a second transaction (each is a consistent state;
        the second alone decides)."""
        if not keys or not timeouts:
            return {}
        args = [str(now_ms).encode(), self.node_key(instance_id, "").encode(), str(len(timeouts)).encode()]
        for kind, timeout in timeouts.items():
            args += [kind.encode(), str(timeout).encode()]
        view = [self.nodes_key(instance_id).encode(), self.view_key(instance_id).encode(), *args]
        bits_key = self.bits_key(instance_id)
        with valkey_errors("reporter store"):  # a read past the socket timeout included
            if len(keys) > HOST_STATE_SPLIT:
                walk, runs = self._host_state_read(
                    bits_key, view, keys[:HOST_STATE_FIRST_PART], mediums, mamba, eagle_pop
                )
                first = walk.prefixes(runs, len(keys))
                if first is not None:
                    return first
            walk, runs = self._host_state_read(bits_key, view, keys, mediums, mamba, eagle_pop)
        return cast(dict[str, int], walk.prefixes(runs, len(keys)))

    def _host_state_read(
        self,
        bits_key: str,
        view: list[bytes],
        keys: Sequence[int],
        mediums: Sequence[str],
        mamba: tuple[Sequence[str], Sequence[str]] | None,
        eagle_pop: bool,
    ) -> tuple[HostWalk, list[tuple[bytes | None, int]]]:
        """The visible slots and the bitmaps of ``keys`` (as runs, ``resp.runs``) in one
        transaction on the instance's node (``MULTI``, the script, the HMGETs, ``EXEC``).

        A script Valkey does not hold (a restart, a failover, SCRIPT FLUSH) fails inside the
        transaction as NOSCRIPT: the transaction is sent again after a SCRIPT LOAD on the same
        connection. A MOVED (the slot served by another node now) updates the cluster
        client's map and the transaction is sent again, once (an ASK, a slot half moved, is
        "retry later")."""
        hmgets = hmget_fields(bits_key.encode(), keys)
        transaction = b"".join(
            (
                MULTI,
                command(b"EVALSHA", self._host_state.sha.encode(), b"2", *view),
                *hmgets,
                EXEC,
            )
        )
        load = not self._host_state_loaded
        for attempt in (1, 2):
            if load:
                data = exchange(self.client, bits_key, self._host_state_load + transaction, 4 + len(hmgets))
            else:
                data = exchange(self.client, bits_key, transaction, 3 + len(hmgets))
            pos = 0
            if load:
                loaded, pos = replies.value(data, pos)
                if isinstance(loaded, Exception):
                    raise loaded
                self._host_state_loaded = True
            failed = None
            for _ in range(2 + len(hmgets)):  # MULTI's +OK, then +QUEUED or the error refusing a command
                reply, pos = replies.value(data, pos)
                failed = failed or (reply if isinstance(reply, Exception) else None)
            if failed is not None:  # EXEC answered EXECABORT: nothing ran
                if attempt == 1 and follow_moved(self.client, failed):
                    continue
                raise failed
            if data[pos : pos + 1] != b"*":  # EXEC's error
                raise replies.value(data, pos)[0]
            pos = data.index(b"\r\n", pos) + 2  # EXEC's array of the two replies
            slots, pos = replies.value(data, pos)
            if isinstance(slots, NoScriptError) and attempt == 1:
                load = True
                continue
            if isinstance(slots, Exception):
                raise slots
            runs: list[tuple[bytes | None, int]] = []
            for _ in hmgets:
                if data[pos : pos + 1] != b"*":  # an HMGET's error
                    raise replies.value(data, pos)[0]
                part, pos = replies.runs(data, pos)
                if runs and part and runs[-1][0] == part[0][0]:  # a run across two HMGETs
                    runs[-1] = (runs[-1][0], runs[-1][1] + part[0][1])
                    part = part[1:]
                runs += part
            return HostWalk(_VISIBLE_SLOTS(slots), mediums, mamba, eagle_pop), runs
        raise AssertionError("unreachable")  # the second attempt returns or raises

    def visible_locations(
        self, instance_id: str, keys: Sequence[int], now_ms: int, timeouts: dict[str, int]
    ) -> list[list[tuple[str, str, str, list[tuple[str, str]]]]]:
        """Per key, its visible reported locations as (rid, location id, medium,
        [(spec, uri with s_version)]), visible specs only. ``timeouts`` as in host_prefixes.
        One round trip (the script reads the reporters itself)."""
        if not keys:
            return []
        args: list[Any] = [now_ms, self.node_key(instance_id, ""), self.records_key(instance_id, ""), len(timeouts)]
        for kind, timeout in timeouts.items():
            args += [kind, timeout]
        raw = self._visible(
            keys=[self.bits_key(instance_id), self.nodes_key(instance_id), self.view_key(instance_id)],
            args=[*args, block_fields(keys)],
        )
        if not raw:  # no reporter visible
            return [[] for _ in keys]
        return [
            [
                (
                    rid,
                    location_id(rid, medium),
                    medium,
                    [(specs[i], versioned_uri(specs[i + 1], specs[i + 2])) for i in range(0, len(specs), 3)],
                )
                for rid, medium, specs in per_key
            ]
            if per_key
            else []
            for per_key in json.loads(raw)
        ]

    def locations(self, instance_id: str, block_key: int) -> list[tuple[str, str, list[tuple[str, str]]]]:
        """The stored locations of one key as (location id, medium, [(spec, uri with s_version)]),
        visible or not."""
        rids = self.reporters(instance_id)
        if not rids:
            return []
        raw = self._dump(
            keys=[self.records_key(instance_id, rid) for rid in rids], args=[block_field(block_key), *rids]
        )
        return [
            (
                location_id(rid, medium),
                medium,
                [(specs[i], versioned_uri(specs[i + 1], specs[i + 2])) for i in range(0, len(specs), 3)],
            )
            for rid, medium, specs in json.loads(raw)
        ]
