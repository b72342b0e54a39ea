"""DebugService methods (handlers in ``chalicelib.services.debug``)."""

from __future__ import annotations

from ..auth import Action, targets
from ..protocol import models as m
from ..services.debug import DebugService as S
from .api import api_blueprint
from .dispatch import Operation

OPERATIONS: list[Operation] = [
    Operation(name, request_model, handler, service="debug", action=Action.DEBUG, target=targets.service)
    for name, request_model, handler in (
        ("injectFault", m.InjectFaultRequest, S.inject_fault),
        ("removeFault", m.RemoveFaultRequest, S.remove_fault),
        ("clearFaults", m.ListRequest, S.clear_faults),
    )
]

blueprint = api_blueprint(__name__, OPERATIONS)
