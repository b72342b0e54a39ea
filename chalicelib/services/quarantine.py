"""Admin listAsyncCopyQuarantine and breakGlassReleaseAsyncCopy (UPSTREAM_V2 §1.2, §2.11;
docs/api-v2.md "Copy quarantine")."""

from __future__ import annotations

from collections.abc import Callable

from ..cache.contexts import ContextProvider
from ..control import ConfigCache
from ..control.audit import AuditEntry, AuditLog
from ..index.errors import CopyGuardError, WriteSessionError
from ..index.layout import CopyGuard
from ..observability.logging import logger
from ..protocol.errors import InstanceNotFoundError, InvalidArgumentError
from ..protocol.models import (
    BreakGlassReleaseAsyncCopyRequest,
    ListAsyncCopyQuarantineRequest,
    ListAsyncCopyQuarantineResponse,
    Response,
)
from ..workflows.quarantine import CopyQuarantine, ReleaseReason

BREAK_GLASS_API = "breakGlassReleaseAsyncCopy"
#: The longest operator_name and external_fencing_evidence kept (the audit message holds both).
MAX_EVIDENCE_LENGTH = 200


class CopyQuarantineAdmin:
    """Lists quarantined Copies and releases one on an operator's word."""

    def __init__(
        self,
        config: ConfigCache,
        contexts: ContextProvider,
        quarantine: CopyQuarantine,
        audit: Callable[[], AuditLog],
    ) -> None:
        self.config = config
        self.contexts = contexts
        self.quarantine = quarantine
        self.audit = audit

    def list_async_copy_quarantine(self, request: ListAsyncCopyQuarantineRequest) -> ListAsyncCopyQuarantineResponse:
        """One record per block of each quarantined Copy of ``instance_group_name`` (""
        every group's), read from the quarantine's index (no instance is scanned)."""
        group = request.instance_group_name or None
        if group is not None:
            try:
                self.config.group(group)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"field 'instance_group_name': {exc}") from exc
        return ListAsyncCopyQuarantineResponse(records=self.quarantine.records(group))

    def break_glass_release_async_copy(self, request: BreakGlassReleaseAsyncCopyRequest) -> Response:
        """Release the quarantined Copy ``operation_id`` now (its targets failed and
        deleted), before its writer's hard timeout: only with every evidence field given and
        ``external_fencing_confirmed`` true, as an exact CAS on the operation and its guard
        state (one step per part: a second release, or one racing it, is refused), and an
        audit record naming the operator, the evidence and the trace id."""
        for field in ("operation_id", "operator_name", "external_fencing_evidence"):
            if not getattr(request, field).strip():
                raise InvalidArgumentError(f"field '{field}' is required")
        for field in ("operator_name", "external_fencing_evidence"):
            if len(getattr(request, field)) > MAX_EVIDENCE_LENGTH:
                raise InvalidArgumentError(f"field '{field}' is longer than {MAX_EVIDENCE_LENGTH} characters")
        if not request.external_fencing_confirmed:
            raise InvalidArgumentError(
                "field 'external_fencing_confirmed' must be true: the writer is fenced before a break-glass release"
            )
        try:
            guard = CopyGuard(request.guard_state or CopyGuard.QUARANTINED)
        except ValueError as exc:
            raise InvalidArgumentError(
                f"field 'guard_state': {request.guard_state} is not a guard state "
                f"({', '.join(f'{g.value} {g.name}' for g in CopyGuard)})"
            ) from exc
        operation_id = request.operation_id
        unknown = InvalidArgumentError(
            f"field 'operation_id': {operation_id!r} is not a quarantined copy operation (unknown or released)"
        )
        listed = self.quarantine.quarantine.find(operation_id)
        if listed is None:
            raise unknown
        try:
            ctx = self.contexts(listed.instance_id)
        except InstanceNotFoundError:
            self.quarantine.quarantine.forget([listed])
            raise unknown from None
        try:
            failed = self.quarantine.release(ctx, operation_id, ReleaseReason.BREAK_GLASS, guard)
        except CopyGuardError as exc:
            held = self.quarantine.guard_of(ctx, operation_id)
            raise InvalidArgumentError(
                f"field 'guard_state': operation {operation_id!r} is {held.name if held else 'released'}, "
                f"not {guard.name}"
            ) from exc
        except WriteSessionError as exc:
            raise unknown from exc
        try:
            self.audit().record(self._audit_entry(request, ctx.instance_id, ctx.group.name, failed))
        except Exception:  # noqa: BLE001 - the release stands (as the dispatcher's records); the loss is logged
            logger.exception("audit record of the break-glass release of %s not written", operation_id)
        return Response()

    @staticmethod
    def _audit_entry(
        request: BreakGlassReleaseAsyncCopyRequest, instance_id: str, group: str, failed: int
    ) -> AuditEntry:
        operation_id = request.operation_id
        return AuditEntry(
            principal=request.caller or request.operator_name,
            source="",
            api_name=BREAK_GLASS_API,
            target=f"operation_id={operation_id} instance_id={instance_id} instance_group={group}",
            code="OK",
            message=(
                f"released by operator_name={request.operator_name!r}, "
                f"external_fencing_evidence={request.external_fencing_evidence!r}, "
                f"trace_id={request.effective_trace_id!r}: {failed} target(s) failed"
            ),
            denied=False,
        )
