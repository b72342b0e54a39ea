"""proto3-JSON on pydantic: field names, int64, enums, parsing and rendering.

Parsing accepts snake_case or lowerCamelCase names, enums by name or number (a JSON
number or a decimal string), integers as a number or a decimal string, ``null`` for a
field as its default, and ignores unknown fields. Rendering prints snake_case names,
default values, enum names and int64 values as strings.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from types import GenericAlias
from typing import Annotated, Any, TypeVar

from annotated_types import GroupedMetadata
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    FailFast,
    GetCoreSchemaHandler,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import core_schema

from .errors import InvalidArgumentError, MalformedBodyError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# The decimal strings proto3 JSON takes for integers and enum numbers. int() alone would
# also take " 1 ", "+3", "1_0" (as 10) and non-ASCII digits.
_DECIMAL = re.compile(r"-?[0-9]+")


def _integer(value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        result = value
    elif isinstance(value, float) and value.is_integer():
        result = int(value)
    elif isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise ValueError(f"expected an integer, got {value!r}")
        result = int(value)
    else:
        raise ValueError(f"expected an integer, got {type(value).__name__}")
    if not lo <= result <= hi:
        raise ValueError(f"{result} is out of range [{lo}, {hi}]")
    return result


def _int64(value: Any) -> int:
    return _integer(value, INT64_MIN, INT64_MAX)


def _int32(value: Any) -> int:
    return _integer(value, INT32_MIN, INT32_MAX)


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"expected a boolean, got {type(value).__name__}")


def _string(value: Any) -> str:
    if isinstance(value, str):
        # JSON can spell an unpaired UTF-16 surrogate ("\ud800"); no UTF-8 text holds one,
        # so it could be neither stored nor sent back.
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("contains an unpaired UTF-16 surrogate") from None
        return value
    raise ValueError(f"expected a string, got {type(value).__name__}")


def _integer_json_schema(lo: int, hi: int) -> WithJsonSchema:
    """What a request may carry for an integer (the OpenAPI document's request side)."""
    return WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": lo, "maximum": hi},
                {"type": "string", "pattern": _DECIMAL.pattern.join("^$")},
            ]
        },
        mode="validation",
    )


Int64 = Annotated[
    int,
    BeforeValidator(_int64),
    PlainSerializer(str, return_type=str, when_used="json"),
    _integer_json_schema(INT64_MIN, INT64_MAX),
    WithJsonSchema({"type": "string", "pattern": _DECIMAL.pattern.join("^$")}, mode="serialization"),
]


#: A list of decimal strings joined by commas (``_int64_list``).
_DECIMALS = re.compile(r"-?[0-9]+(?:,-?[0-9]+)*")


def _decimal_strings(value: list[str]) -> list[int] | None:
    """``value``'s integers, or None unless every item is a decimal string: one regex over
    the joined items (an item holding a comma passes it but fails ``int``)."""
    if not _DECIMALS.fullmatch(",".join(value)):
        return None
    try:
        return list(map(int, value))
    except ValueError:  # an item with a comma, or past int()'s digit limit
        return None


def _int64_list(value: Any, handler: ValidatorFunctionWrapHandler) -> list[int]:
    # Requests carry thousands of keys or token ids, nearly always a JSON array of in-range
    # integers, or of decimal strings (proto3 JSON prints int64 so): checked in C loops
    # here. Anything else goes item by item, so an error names the offending index.
    if type(value) is list and value:
        types = set(map(type, value))
        numbers = value if types == {int} else _decimal_strings(value) if types == {str} else None
        if numbers is not None and INT64_MIN <= min(numbers) and max(numbers) <= INT64_MAX:
            return numbers
    checked: list[int] = handler(value)
    return checked


@dataclass(frozen=True)
class ParseLimits:
    """Bounds a request's lists are checked against before their items are (the
    validation context ``parse_model`` passes): a list of 500,000 bad items is refused by
    its length, not after 500,000 item errors."""

    #: Items a list of block keys may hold (``Settings.max_keys_per_request``).
    max_keys: int


def _key_list(value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> list[int]:
    limits = info.context
    if isinstance(limits, ParseLimits) and type(value) is list and len(value) > limits.max_keys:
        raise ValueError(f"{len(value)} keys exceed the limit of {limits.max_keys}")
    return _int64_list(value, handler)


T = TypeVar("T")
#: A request's list: its validation stops at the first bad item (pydantic's ``FailFast``),
#: so the errors a body can make are bounded by its schema, not by its length.
Items = Annotated[list[T], FailFast()]
#: A list of int64 (token ids), item errors failing fast.
Int64List = Annotated[list[Int64], FailFast(), WrapValidator(_int64_list)]
#: A list of block keys: also refused by its length (``ParseLimits.max_keys``) before any
#: item is checked.
KeyList = Annotated[list[Int64], FailFast(), WrapValidator(_key_list)]


def key_list_of_at_most(limit: int) -> Any:
    """A list of block keys with a bound of its own (not ``ParseLimits.max_keys``), refused
    by its length past ``limit`` before any item is checked."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> list[int]:
        if type(value) is list and len(value) > limit:
            raise ValueError(f"{len(value):,} keys exceed the limit of {limit:,}")
        return _int64_list(value, handler)

    return Annotated[list[Int64], FailFast(), WrapValidator(check)]


Int32 = Annotated[int, BeforeValidator(_int32), _integer_json_schema(INT32_MIN, INT32_MAX)]
Bool = Annotated[bool, BeforeValidator(_boolean)]
Str = Annotated[str, BeforeValidator(_string)]


class WireEnum(GroupedMetadata):
    """``Annotated[SomeEnum, WireEnum(SomeEnum)]``: an enum field that parses a name or a
    number (a JSON number or a decimal string) and renders the name."""

    def __init__(self, enum_cls: type[IntEnum]) -> None:
        def parse(value: Any) -> IntEnum:
            if isinstance(value, enum_cls):
                return value
            number = value
            if isinstance(value, str):
                try:
                    return enum_cls[value]
                except KeyError:
                    pass
                # protobuf's json_format also takes the number as a string ("2").
                number = int(value) if _DECIMAL.fullmatch(value) else None
            if isinstance(number, int) and not isinstance(number, bool):
                try:
                    return enum_cls(number)
                except ValueError:
                    pass
            names = ", ".join(m.name for m in enum_cls)
            raise ValueError(f"unknown {enum_cls.__name__} {value!r} (one of {names})")

        member_names = [member.name for member in enum_cls]
        numbers = [member.value for member in enum_cls]
        self._metadata = (
            BeforeValidator(parse),
            PlainSerializer(_enum_name, return_type=str),
            WithJsonSchema(
                {"title": enum_cls.__name__, "enum": member_names + numbers + list(map(str, numbers))},
                mode="validation",
            ),
            WithJsonSchema({"title": enum_cls.__name__, "type": "string", "enum": member_names}, mode="serialization"),
        )

    def __iter__(self) -> Iterator[object]:
        return iter(self._metadata)


def _enum_name(member: IntEnum) -> str:
    return member.name


class JsonArray(Sequence[Any]):
    """A JSON array whose items the code that built it rendered to JSON text.

    Hot-path responses carry hundreds of locations: rendering each from a template
    prepared once per request is several times cheaper than building dicts for pydantic
    to encode. ``render`` splices the texts in as they are; Python readers get decoded
    items. Subclasses name the item type (``item_type``) that validation from a list uses.
    """

    __slots__ = ("_texts",)
    item_type: Any = Any

    def __init__(self, texts: Iterable[str] = ()) -> None:
        self._texts = list(texts)

    @classmethod
    def of(cls, items: Iterable[Any]) -> JsonArray:
        """An array of ``items`` (JSON-encodable values)."""
        return cls(json.dumps(item, separators=(",", ":")) for item in items)

    def __len__(self) -> int:
        return len(self._texts)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [json.loads(text) for text in self._texts[index]]
        return json.loads(self._texts[index])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (JsonArray, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"

    def json(self) -> str:
        """The array as JSON text."""
        return "[" + ",".join(self._texts) + "]"

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        items = handler.generate_schema(GenericAlias(list, (cls.item_type,)))
        from_list = core_schema.no_info_after_validator_function(cls.of, items)
        return core_schema.union_schema(
            [core_schema.is_instance_schema(cls), from_list],
            serialization=core_schema.plain_serializer_function_ser_schema(list),
        )


def empty_list() -> list[Any]:
    """A list field's ``default_factory``. pydantic reads a factory's signature at a
    model's first build; ``list``'s is a builtin's text signature, which costs the
    tokenizer (its first use compiles its regexes) where a function's costs nothing."""
    return []


class WireModel(BaseModel):
    """Base of every request and response model."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=False,
        loc_by_alias=False,
        extra="ignore",
        # One mutable default per instance, never shared between requests.
        validate_default=False,
        # Validators and serializers are built at a model's first use, not at import: a
        # cold start builds the few models its first request needs, not all of them
        # (15 fresh processes in turns: first answer 723 -> 670 ms; bench_cold_start.py).
        defer_build=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        # proto3 JSON: a field given as null has its default value (json_format clears it).
        # Only the object's own keys: a null item of a list stays an error at its index.
        if type(data) is dict and None in data.values():
            return {key: value for key, value in data.items() if value is not None}
        return data


def field_path(loc: tuple[int | str, ...]) -> str:
    """Render a pydantic error location as ``a.b[0].c``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and not part.startswith(("function-", "list[", "dict[")):
            out += f".{part}" if out else part
    return out or "<body>"


#: Fields a validation message names at most, and its length: a body of bad items must
#: not get a 29 MB answer (lists fail fast: at most one item error each).
MAX_ERRORS_NAMED = 5
MAX_ERROR_MESSAGE = 1024


def describe_validation_error(err: ValidationError) -> str:
    """A one-line message naming the first offending fields (``MAX_ERRORS_NAMED``) and how
    many were found (a list stops at its first bad item), at most ``MAX_ERROR_MESSAGE``
    characters."""
    parts = []
    for item in itertools.islice(err.errors(include_url=False, include_input=False), MAX_ERRORS_NAMED):
        msg = item["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        parts.append(f"field '{field_path(item['loc'])}': {msg}")
    total = err.error_count()
    text = "; ".join(parts) + (f" ({total} invalid fields found)" if total > len(parts) else "")
    return text if len(text) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 1] + "…"


def decode_body(raw: bytes | str | None) -> dict[str, Any]:
    """The JSON object in an HTTP body (empty body = ``{}``), else MalformedBodyError."""
    if raw is None or raw == b"" or raw == "":
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise MalformedBodyError("request body is not valid JSON") from None
    except RecursionError:
        raise MalformedBodyError("request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise MalformedBodyError("request body is not a JSON object")
    return data


def build_models() -> int:
    """Build every wire model's validator and serializer now (each is otherwise built at
    its first use: ``defer_build``), e.g. into a SnapStart snapshot; how many were built."""
    built, pending = 0, list(WireModel.__subclasses__())
    while pending:
        model = pending.pop()
        pending.extend(model.__subclasses__())
        if not model.__pydantic_complete__:
            model.model_rebuild()
            built += 1
    return built


def parse_model[M: BaseModel](model: type[M], data: dict[str, Any], limits: ParseLimits | None = None) -> M:
    """Validate a decoded JSON object into ``model``, its key lists within ``limits``;
    errors name the field."""
    try:
        return model.model_validate(data, context=limits)
    except ValidationError as err:
        raise InvalidArgumentError(describe_validation_error(err)) from None


def render(model: BaseModel) -> str:
    """The proto3-JSON text of a response model (absent sub-messages omitted), encoded by
    pydantic-core, with its top-level ``JsonArray`` fields spliced in as rendered."""
    arrays = {name: value for name, value in model.__dict__.items() if isinstance(value, JsonArray)}
    text = model.model_dump_json(exclude_none=True, exclude=set(arrays) or None)
    if not arrays:
        return text
    spliced = ",".join(f"{json.dumps(name)}:{value.json()}" for name, value in arrays.items())
    return f"{text[:-1]},{spliced}}}" if text != "{}" else f"{{{spliced}}}"
