"""control.attributes converts like boto3.dynamodb.types (the reference), both ways."""

from decimal import Decimal

import pytest
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from chalicelib.control.attributes import deserialize, serialize

VALUES = [
    None,
    True,
    False,
    0,
    -7,
    2**63,
    Decimal("1.5"),
    Decimal("-0.000001"),
    Decimal("1e125"),
    "",
    "text",
    "ünï",
    b"",
    b"\x00\xff",
    bytearray(b"ab"),
    {1, 2},
    {Decimal("3.25")},
    {"a", "b"},
    {b"x", b"y"},
    set(),
    {True},
    [],
    [1, "a", None, [b"z"], {"k": {2}}],
    (1, 2),
    {},
    {"nested": {"list": [True, {"n": Decimal(7)}]}},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_serializes_like_boto3(value):
    expected = TypeSerializer().serialize(value)
    got = serialize(value)
    if set(expected) & {"SS", "NS", "BS"}:  # set order is the set's iteration order in both; compare as sets
        kind = next(iter(expected))
        assert set(got) == {kind} and sorted(got[kind]) == sorted(expected[kind])
    else:
        assert got == expected


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_round_trips_like_boto3(value):
    attribute = TypeSerializer().serialize(value)
    assert deserialize(attribute) == TypeDeserializer().deserialize(attribute)


@pytest.mark.parametrize(
    "value",
    [
        1.5,
        Decimal("1.0000000000000000000000000000000000000001"),
        Decimal("1e200"),
        Decimal("NaN"),
        Decimal("Infinity"),
        object(),
        {1, "a"},
        {1.5},
    ],
    ids=repr,
)
def test_refuses_what_boto3_refuses(value):
    with pytest.raises(Exception) as reference:
        TypeSerializer().serialize(value)
    with pytest.raises(type(reference.value)):
        serialize(value)


@pytest.mark.parametrize("attribute", [{}, {"X": 1}])
def test_refuses_unknown_attribute_kinds(attribute):
    with pytest.raises(TypeError):
        TypeDeserializer().deserialize(attribute)
    with pytest.raises(TypeError):
        deserialize(attribute)


def test_numbers_come_back_as_decimals_and_binary_as_bytes():
    assert deserialize({"N": "42"}) == Decimal(42) and isinstance(deserialize({"N": "42"}), Decimal)
    assert deserialize({"B": b"\x01"}) == b"\x01" and isinstance(deserialize({"B": b"\x01"}), bytes)
    assert deserialize({"NS": ["1", "2.5"]}) == {Decimal(1), Decimal("2.5")}
