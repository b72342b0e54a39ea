"""DynamoDB attribute values ⇄ Python values, the way ``boto3.dynamodb.types`` converts
them, without importing boto3 (and s3transfer with it) into a cold container.

Same conversions and same refusals as boto3's ``TypeSerializer`` / ``TypeDeserializer``:
numbers are ``int`` or ``Decimal`` (a float is a TypeError) within DynamoDB's 38 digits,
come back as ``Decimal``; sets are homogeneous sets of numbers, strings or bytes. One
difference: binary values come back as ``bytes`` where boto3 wraps them in its
``Binary`` (which compares equal to the bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from decimal import Clamped, Context, Decimal, Inexact, Overflow, Rounded, Underflow
from typing import Any

#: DynamoDB's number range and precision; an inexact or rounded number is an error.
DYNAMODB_CONTEXT = Context(Emin=-128, Emax=126, prec=38, traps=[Clamped, Overflow, Inexact, Rounded, Underflow])
_BINARY = (bytes, bytearray)


def _is_number(value: Any) -> bool:
    if isinstance(value, float):
        raise TypeError("Float types are not supported. Use Decimal types instead.")
    return isinstance(value, (int, Decimal))


def _number(value: Any) -> str:
    text = str(DYNAMODB_CONTEXT.create_decimal(value))
    if text in ("Infinity", "NaN"):
        raise TypeError("Infinity and NaN not supported")
    return text


def _set_of(value: Set[Any], is_member: Callable[[Any], bool]) -> bool:
    return all(is_member(member) for member in value)


def serialize(value: Any) -> dict[str, Any]:
    """A Python value → its DynamoDB attribute value (``{"S": ...}``, ``{"N": ...}``...)."""
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if _is_number(value):
        return {"N": _number(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, _BINARY):
        return {"B": value}
    if isinstance(value, Set):
        if _set_of(value, _is_number):
            return {"NS": [_number(member) for member in value]}
        if _set_of(value, lambda member: isinstance(member, str)):
            return {"SS": list(value)}
        if _set_of(value, lambda member: isinstance(member, _BINARY)):
            return {"BS": list(value)}
    if isinstance(value, Mapping):
        return {"M": {k: serialize(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"L": [serialize(v) for v in value]}
    raise TypeError(f'Unsupported type "{type(value)}" for value "{value}"')


_DESERIALIZERS: dict[str, Callable[[Any], Any]] = {
    "NULL": lambda value: None,
    "BOOL": lambda value: value,
    "N": DYNAMODB_CONTEXT.create_decimal,
    "S": lambda value: value,
    "B": bytes,
    "NS": lambda values: set(map(DYNAMODB_CONTEXT.create_decimal, values)),
    "SS": set,
    "BS": lambda values: set(map(bytes, values)),
    "L": lambda values: [deserialize(v) for v in values],
    "M": lambda values: {k: deserialize(v) for k, v in values.items()},
}


def deserialize(attribute: Mapping[str, Any]) -> Any:
    """A DynamoDB attribute value → its Python value (numbers as ``Decimal``)."""
    if not attribute:
        raise TypeError("Value must be a nonempty dictionary whose key is a valid dynamodb type.")
    kind = next(iter(attribute))
    convert = _DESERIALIZERS.get(kind)
    if convert is None:
        raise TypeError(f"Dynamodb type {kind} is not supported")
    return convert(attribute[kind])
