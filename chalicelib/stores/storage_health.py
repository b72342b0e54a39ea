"""Storage health as the health checks last saw it, kept in Valkey so that every
container (and the next scheduled run) shares the hysteresis state."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import cast

from ..storage.health import StorageHealth
from .valkey import Valkey, valkey_errors


class StorageHealthStore:
    """``{storage name: StorageHealth}`` in one Valkey hash."""

    def __init__(self, client: Valkey, prefix: str) -> None:
        self.client = client
        self.key = f"{prefix}:storage-health"

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

    def unhealthy(self) -> set[str]:
        """Names of the storages whose probes put them out of service."""
        return {name for name, state in self.load().items() if not state.available}
