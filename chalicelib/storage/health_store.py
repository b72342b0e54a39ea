"""Storage health as the health checks last saw it, kept in Valkey so that every
container (and the next scheduled run) shares the hysteresis state."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import cast

from ..clock import Clock, SystemClock, now_ms
from ..valkey import Valkey, valkey_errors
from .health import StorageHealth

#: KEYS[1] the storage's last out-of-schedule probe time; ARGV: now (ms), interval (ms).
#: The clock's time is the caller's (injectable); the key's TTL only collects garbage.
_CLAIM = """
local last = tonumber(redis.call('GET', KEYS[1]) or '-1')
local now, interval = tonumber(ARGV[1]), tonumber(ARGV[2])
if last >= 0 and now >= last and now - last < interval then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', 3600000)
return 1
"""


class StorageHealthStore:
    """``{storage name: StorageHealth}`` in one Valkey hash, and when each storage was
    last probed out of schedule."""

    def __init__(self, client: Valkey, prefix: str, clock: Clock | None = None) -> None:
        self.client = client
        self.key = f"{prefix}:storage-health"
        self.clock = clock or SystemClock()
        self._claim = client.register_script(_CLAIM)

    def load(self) -> dict[str, StorageHealth]:
        with valkey_errors("storage health store"):
            raw_states = cast(dict[bytes, bytes], self.client.hgetall(self.key))
        return {name.decode(): StorageHealth(**json.loads(raw)) for name, raw in raw_states.items()}

    def save(self, states: Mapping[str, StorageHealth]) -> None:
        if states:
            with valkey_errors("storage health store"):
                self.client.hset(self.key, mapping={name: json.dumps(state.__dict__) for name, state in states.items()})

    def forget(self, names: Iterable[str]) -> None:
        names = list(names)
        if names:
            with valkey_errors("storage health store"):
                self.client.hdel(self.key, *names)

    def out_of_service(self) -> dict[str, StorageHealth]:
        """The storages whose probes put them out of service (unavailable, or full), by name."""
        return {name: state for name, state in self.load().items() if not state.available}

    def claim_probe(self, storage: str, interval_ms: int) -> bool:
        """True for the first caller in ``interval_ms`` (every container): it may probe
        ``storage`` now, out of the scheduled rounds."""
        with valkey_errors("storage health store"):
            return bool(self._claim(keys=[f"{self.key}:reprobe:{storage}"], args=[now_ms(self.clock), interval_ms]))
