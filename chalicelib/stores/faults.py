"""Fault injection for the debug service, kept in Valkey so every container sees it."""

from __future__ import annotations

import json

from ..protocol.codes import FaultTriggerStrategy, FaultType
from ..protocol.errors import InjectedFaultError
from ..valkey import Valkey, valkey_errors


class FaultRegistry:
    """Faults by API name: ``check`` raises InjectedFaultError when one triggers."""

    def __init__(self, client: Valkey, prefix: str) -> None:
        self.client = client
        self.key = f"{prefix}:faults"

    def inject(
        self, api_name: str, fault_type: FaultType, strategy: FaultTriggerStrategy, trigger_at_call: int
    ) -> None:
        with valkey_errors("fault registry"):
            self.client.hset(
                self.key,
                api_name,
                json.dumps({"type": fault_type.name, "strategy": strategy.name, "at": trigger_at_call}),
            )

    def remove(self, api_name: str) -> bool:
        with valkey_errors("fault registry"):
            return bool(self.client.hdel(self.key, api_name))

    def clear(self) -> None:
        with valkey_errors("fault registry"):
            self.client.delete(self.key)

    def check(self, api_name: str, trace_id: str) -> None:
        """Raise the fault injected for ``api_name``, if it triggers for this call.

        ONCE triggers only when the integer after the last ``_`` of ``trace_id`` equals
        ``trigger_at_call`` (upstream's rule); ALWAYS on every call.
        """
        with valkey_errors("fault registry"):
            raw = self.client.hget(self.key, api_name)
        if raw is None:
            return
        fault = json.loads(raw)
        if fault["strategy"] == FaultTriggerStrategy.ONCE.name:
            _, _, tail = trace_id.rpartition("_")
            if not tail.isdigit() or int(tail) != fault["at"]:
                return
        raise InjectedFaultError(f"fault injected into {api_name} ({fault['type']})")
