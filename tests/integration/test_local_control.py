"""The local stack's control table: snapshot round trip and idempotent seeding."""
from __future__ import annotations

import urllib.request

import boto3

from chalicelib.clock import ManualClock
from chalicelib.control import ControlPlane, ensure_table
from chalicelib.local.control import ControlSnapshot
from chalicelib.local.seed import GROUP_NAME, GROUP_QUOTA_BYTES, STORAGE_NAME, seed_defaults

TABLE = "kvcm-control-test"


def control_plane(client) -> ControlPlane:
    return ControlPlane(dynamodb=lambda: client, table_name=TABLE, clock=ManualClock())


def test_snapshot_restores_every_item_into_an_empty_table(aws, tmp_path):
    dynamodb = boto3.client("dynamodb")
    ensure_table(dynamodb, TABLE)
    seed_defaults(control_plane(dynamodb), tmp_path / "data")
    dynamodb.put_item(TableName=TABLE, Item={"pk": {"S": "TEST"}, "sk": {"S": "binary"},
                                             "b": {"B": b"\x00\xff"}, "bs": {"BS": [b"\x01", b"\x02"]},
                                             "m": {"M": {"l": {"L": [{"B": b"\x03"}, {"N": "7"}]}}}})
    for n in range(30):  # more than one BatchWriteItem
        dynamodb.put_item(TableName=TABLE, Item={"pk": {"S": "TEST"}, "sk": {"S": f"item-{n:02}"}})
    before = dynamodb.scan(TableName=TABLE)["Items"]
    snapshot = ControlSnapshot(dynamodb, TABLE, tmp_path / "control.json")
    assert snapshot.save() == len(before)

    urllib.request.urlopen(urllib.request.Request(f"{aws}/moto-api/reset", method="POST")).read()
    ensure_table(dynamodb, TABLE)
    assert snapshot.restore() == len(before)
    key = lambda item: (item["pk"]["S"], item["sk"]["S"])  # noqa: E731
    assert sorted(dynamodb.scan(TableName=TABLE)["Items"], key=key) == sorted(before, key=key)
    assert control_plane(dynamodb).get_group(GROUP_NAME).storage_candidates == [STORAGE_NAME]


def test_restore_without_a_snapshot_is_a_no_op(aws, tmp_path):
    dynamodb = boto3.client("dynamodb")
    ensure_table(dynamodb, TABLE)
    assert ControlSnapshot(dynamodb, TABLE, tmp_path / "absent.json").restore() == 0


def test_seeding_adds_only_what_is_absent(aws, tmp_path):
    dynamodb = boto3.client("dynamodb")
    ensure_table(dynamodb, TABLE)
    control = control_plane(dynamodb)
    assert seed_defaults(control, tmp_path / "data") == [STORAGE_NAME, GROUP_NAME]
    assert seed_defaults(control, tmp_path / "data") == []
    storage = control.get_storage(STORAGE_NAME)
    assert storage.config.nfs.root_path == str((tmp_path / "data" / STORAGE_NAME).resolve())
    assert storage.config.nfs.key_count_per_file == 8
    assert (tmp_path / "data" / STORAGE_NAME).is_dir()
    assert control.get_group(GROUP_NAME).quota.capacity == GROUP_QUOTA_BYTES
