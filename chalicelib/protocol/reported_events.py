"""reportEvent's events without a pydantic model per event (issue #25 item 1).

An engine's request carries thousands of events; a pydantic model per event, payload and
spec cost about 17 µs per event. Here the events are msgspec structs (``Event`` and its
payloads), checked and built in C:

- ``decode_report_body``: the body as engines and the relay send it (snake_case names, enum
  names, no nulls, no unknown fields) decoded and type-checked in one pass; anything else is
  ``None`` and takes the pydantic path, so every error stays the one it was.
- ``ReportedEvents``: the events field of ``ReportEventRequest`` whichever way it was parsed
  (from the pydantic path, the validated ``EventItem`` models are converted once).

The payload rules past the shapes (block keys, names, URIs) are the service's
(``cache.event_reports``): an invalid event gets its own item code, not a request error.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Annotated, Any, ClassVar, overload

import msgspec
from pydantic import FailFast, GetCoreSchemaHandler
from pydantic_core import core_schema

from .codes import ReportEventType, StorageType

#: Event type name → member (a name not here sends the body to the pydantic path).
EVENT_TYPES = {member.name: member for member in ReportEventType}
_STORAGE_TYPES = {member.name: member for member in StorageType}


class WireStruct(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A wire object of the fast path: an unknown (or camelCase) field rejects the body.
    Untracked by the garbage collector (``gc=False``): a 20,000-event body's 80,000 structs
    would otherwise set off collections of the whole heap; they hold only strings, lists and
    other structs, so they form no cycle."""


class Spec(WireStruct):
    name: str = ""
    uri: str = ""


class BlockAdd(WireStruct):
    block_key: str = ""
    uri: str = ""  # deprecated upstream, ignored: only specs count
    medium: str = ""
    specs: list[Spec] = []


class BlockDelete(WireStruct):
    block_key: str = ""
    medium: str = ""
    spec_names: list[str] = []


class SnapshotBlock(WireStruct):
    block_key: str = ""
    medium: str = ""
    specs: list[Spec] = []


class BlockSnapshot(WireStruct):
    medium: str = ""  # deprecated upstream (single-medium form), ignored
    blocks: list[SnapshotBlock] = []


class NodeRegister(WireStruct):
    mediums: list[str] = []


class HostDown(WireStruct):
    pass


class Heartbeat(WireStruct):
    system_status: dict[str, str] = {}  # opaque


class Event(WireStruct):
    """One event; at most one payload is set (the pydantic path checks the oneof, the fast
    path lets only objects of at most ``event_type`` and one payload through)."""

    event_type: str = "EVENT_UNSPECIFIED"
    node_register: NodeRegister | None = None
    block_add: BlockAdd | None = None
    block_delete: BlockDelete | None = None
    host_down: HostDown | None = None
    heartbeat: Heartbeat | None = None
    block_snapshot: BlockSnapshot | None = None

    @property
    def kind(self) -> ReportEventType:
        return EVENT_TYPES[self.event_type]


class HeaderStruct(WireStruct):
    trace_id: str = ""


class ReportBody(WireStruct):
    """A reportEvent body in the engines' spelling."""

    instance_id: str = ""
    host_ip_port: str = ""
    events: list[Event] = []
    storage_type: str = "ST_UNSPECIFIED"
    trace_id: str = ""
    header: HeaderStruct | None = None

    @property
    def storage(self) -> StorageType:
        return _STORAGE_TYPES[self.storage_type]


_DECODER = msgspec.json.Decoder(ReportBody)


def _canonical(body: ReportBody) -> bool:
    """Whether every enum is a known name and no event sets two payloads: what msgspec's
    types leave to the pydantic models."""
    if body.storage_type not in _STORAGE_TYPES:
        return False
    for event in body.events:
        if event.event_type not in EVENT_TYPES:
            return False
        payloads = (
            event.node_register,
            event.block_add,
            event.block_delete,
            event.host_down,
            event.heartbeat,
            event.block_snapshot,
        )
        if len(payloads) - payloads.count(None) > 1:
            return False
    return True


def decode_report_body(raw: bytes | str) -> ReportBody | None:
    """The body decoded and type-checked in one pass (UTF-8 checked: no string holds an
    unpaired surrogate), or None when it is not in the engines' spelling (the pydantic path
    then decides: a valid body in another spelling, or the error naming the field)."""
    try:
        body = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return body if _canonical(body) else None


class ReportedEvents(Sequence[Event]):
    """A reportEvent request's events as ``Event`` structs. ``item_model`` (models.py) is
    the pydantic model a list is validated with when the events come through pydantic."""

    __slots__ = ("_events",)
    item_model: ClassVar[Any] = Any

    def __init__(self, events: list[Event] | None = None) -> None:
        self._events = events if events is not None else []

    @classmethod
    def of_models(cls, items: list[Any]) -> ReportedEvents:
        """The events of validated pydantic items (their fields already checked)."""
        return cls(
            [msgspec.convert(item.model_dump(exclude_none=True, mode="json"), Event, strict=True) for item in items]
        )

    def __len__(self) -> int:
        return len(self._events)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        return self._events[index]

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (ReportedEvents, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._events!r})"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def validate(value: Any, models: core_schema.ValidatorFunctionWrapHandler) -> ReportedEvents:
            # As the field's own list[EventItem]: the errors name ``events[i]...`` as before.
            return value if isinstance(value, cls) else cls.of_models(models(value))

        return core_schema.no_info_wrap_validator_function(
            validate,
            # Item errors fail fast, as every request list's (wire.Items).
            handler.generate_schema(Annotated[list[cls.item_model], FailFast()]),  # type: ignore[name-defined]
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda events: msgspec.to_builtins(list(events))
            ),
        )
