"""Where the background GC's scan stands, kept in Valkey between its scheduled runs (any
node may hold the background lease next time): the instance it visited last, each
instance's SSCAN cursor over its occupied buckets, the instances done this round, and
until when it pauses after a round."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from redis.typing import EncodableT, FieldT

from ..valkey import Valkey, valkey_errors

_AT = "at"
_STARTED = "started"
_PAUSED_UNTIL = "paused_until"
_CURSOR = "c:"
_DONE = "d:"
_FAILURES = "f:"


@dataclass
class GcScanState:
    """One round of the GC's scan: a pass over every instance."""

    #: The instance visited last ("" before the first).
    position: str = ""
    #: When the round started (s); 0 before its first run.
    started_s: float = 0.0
    #: No scan before this time (s): the pause after the previous round.
    paused_until_s: float = 0.0
    cursors: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    #: Consecutive failed visits per instance this round.
    failures: dict[str, int] = field(default_factory=dict)


class GcStateStore:
    """``GcScanState`` in one Valkey hash."""

    def __init__(self, client: Valkey, prefix: str) -> None:
        self.client = client
        self.key = f"{prefix}:cache-gc"

    def load(self) -> GcScanState:
        with valkey_errors("cache gc state"):
            raw = cast(dict[bytes, bytes], self.client.hgetall(self.key))
        state = GcScanState()
        for name_bytes, value_bytes in raw.items():
            name, value = name_bytes.decode(), value_bytes.decode()
            if name == _AT:
                state.position = value
            elif name == _STARTED:
                state.started_s = float(value)
            elif name == _PAUSED_UNTIL:
                state.paused_until_s = float(value)
            elif name.startswith(_CURSOR):
                state.cursors[name[len(_CURSOR) :]] = int(value)
            elif name.startswith(_DONE):
                state.done.add(name[len(_DONE) :])
            elif name.startswith(_FAILURES):
                state.failures[name[len(_FAILURES) :]] = int(value)
        return state

    def start_round(self, now_s: float) -> None:
        """A new round: every instance from the start of its occupied buckets."""
        self._replace(_STARTED, now_s)

    def visited(self, instance_id: str, cursor: int, done: bool, failures: int = 0) -> None:
        """Record a visit: where the instance's scan goes on next time, whether its pass
        is over, and its consecutive failures."""
        mapping: dict[FieldT, EncodableT] = {
            _AT: instance_id,
            _CURSOR + instance_id: cursor,
            _FAILURES + instance_id: failures,
        }
        if done:
            mapping[_DONE + instance_id] = 1
        with valkey_errors("cache gc state"):
            self.client.hset(self.key, mapping=mapping)

    def finish_round(self, paused_until_s: float) -> None:
        """The round is over: forget the cursors, pause until ``paused_until_s``."""
        self._replace(_PAUSED_UNTIL, paused_until_s)

    def _replace(self, name: str, value: float) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.key)
        pipe.hset(self.key, name, repr(value))
        with valkey_errors("cache gc state"):
            pipe.execute()
