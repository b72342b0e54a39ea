"""DebugService methods: fault injection, when the stage turns the debug service on."""
from __future__ import annotations

from ..auth import Action, targets
from ..protocol import models as m
from ..protocol.errors import InvalidArgumentError, UnsupportedError
from .api import api_blueprint
from .dispatch import Operation


def api_key(name: str) -> str:
    """Faults are keyed by the lowerCamelCase method name (``GetCacheLocation`` works too)."""
    return name[:1].lower() + name[1:]


def _faults(runtime):
    settings = runtime.settings
    if not settings.debug_service:
        raise UnsupportedError("the debug service is disabled in this stage")
    # Fault injection fails other tenants' calls: on a deployed stage only an admin may.
    if not settings.auth_enabled and settings.stage != "local":
        raise UnsupportedError(f"the debug service needs auth on stage '{settings.stage}' (KVCM_AUTH)")
    return runtime.faults


def inject_fault(runtime, req: m.InjectFaultRequest) -> m.Response:
    faults = _faults(runtime)
    if not req.api_name:
        raise InvalidArgumentError("field 'api_name' is required")
    faults.inject(api_key(req.api_name), req.fault_type, req.fault_trigger_strategy, req.trigger_at_call)
    return m.Response()


def remove_fault(runtime, req: m.RemoveFaultRequest) -> m.Response:
    faults = _faults(runtime)
    if not req.api_name:
        raise InvalidArgumentError("field 'api_name' is required")
    faults.remove(api_key(req.api_name))
    return m.Response()


def clear_faults(runtime, req: m.ListRequest) -> m.Response:
    _faults(runtime).clear()
    return m.Response()


OPERATIONS: list[Operation] = [
    Operation(name, request_model, handler, service="debug", action=Action.DEBUG, target=targets.service)
    for name, request_model, handler in (("injectFault", m.InjectFaultRequest, inject_fault),
                                         ("removeFault", m.RemoveFaultRequest, remove_fault),
                                         ("clearFaults", m.ListRequest, clear_faults))
]

blueprint = api_blueprint(__name__, OPERATIONS)
