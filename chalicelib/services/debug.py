"""DebugService: fault injection, when the stage turns the debug service on."""

from __future__ import annotations

from collections.abc import Callable

from ..protocol import models as m
from ..protocol.errors import InvalidArgumentError, UnsupportedError
from ..stores.faults import FaultRegistry


def api_key(name: str) -> str:
    """Faults are keyed by the lowerCamelCase method name (``GetCacheLocation`` works too)."""
    return name[:1].lower() + name[1:]


class DebugService:
    """injectFault, removeFault, clearFaults."""

    def __init__(self, faults: Callable[[], FaultRegistry], enabled: bool, auth_enabled: bool, stage: str) -> None:
        self._faults = faults
        self.enabled = enabled
        self.auth_enabled = auth_enabled
        self.stage = stage

    def faults(self) -> FaultRegistry:
        """The registry, once the stage allows fault injection."""
        if not self.enabled:
            raise UnsupportedError("the debug service is disabled in this stage")
        # Fault injection fails other tenants' calls: on a deployed stage only an admin may.
        if not self.auth_enabled and self.stage != "local":
            raise UnsupportedError(f"the debug service needs auth on stage '{self.stage}' (KVCM_AUTH)")
        return self._faults()

    def inject_fault(self, req: m.InjectFaultRequest) -> m.Response:
        faults = self.faults()
        if not req.api_name:
            raise InvalidArgumentError("field 'api_name' is required")
        faults.inject(api_key(req.api_name), req.fault_type, req.fault_trigger_strategy, req.trigger_at_call)
        return m.Response()

    def remove_fault(self, req: m.RemoveFaultRequest) -> m.Response:
        faults = self.faults()
        if not req.api_name:
            raise InvalidArgumentError("field 'api_name' is required")
        faults.remove(api_key(req.api_name))
        return m.Response()

    def clear_faults(self, req: m.ListRequest) -> m.Response:
        self.faults().clear()
        return m.Response()
