"""The control table's attribute conversion on moto: what it writes, boto3's DynamoDB
resource reads back alike, and what boto3 writes, it reads back alike."""

from decimal import Decimal

import boto3

from chalicelib.control import ensure_table
from chalicelib.control.table import ControlTable, put

ITEM = {
    "none": None,
    "flag": True,
    "count": 12,
    "big": 2**70,
    "ratio": Decimal("0.125"),
    "name": "grp-ü",
    "blob": b"\x00\x01",
    "groups": {"a", "b"},
    "sizes": {1, 2, 3},
    "digests": {b"d1", b"d2"},
    "doc": {"list": [1, "x", None, {"deep": [Decimal("-2.5")]}], "empty": {}},
    "items": [],
}


def test_items_round_trip_between_the_table_and_boto3(aws, clock):
    client = boto3.client("dynamodb")
    ensure_table(client, "t")
    table = ControlTable(lambda: client, "t", clock)
    reference = boto3.resource("dynamodb").Table("t")

    table.write([put("KIND", "ours", ITEM)])
    assert reference.get_item(Key={"pk": "KIND", "sk": "ours"}, ConsistentRead=True)["Item"] == {
        "pk": "KIND",
        "sk": "ours",
        **ITEM,
    }

    reference.put_item(Item={"pk": "KIND", "sk": "boto3", **ITEM})
    read = table.get("KIND", "boto3")
    assert read == {"pk": "KIND", "sk": "boto3", **ITEM}
    assert isinstance(read["count"], Decimal) and isinstance(read["blob"], bytes)
    assert [item["sk"] for item in table.query("KIND")] == ["boto3", "ours"]
