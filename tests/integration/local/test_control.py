"""The local stack's control table: snapshot round trip, the journal of every write, and
idempotent seeding."""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest

from chalicelib.clock import ManualClock
from chalicelib.control import ControlPlane, ensure_table
from chalicelib.protocol.codes import Role
from chalicelib.protocol.errors import CapacityExceededError
from local_stack.control import ControlSnapshot, JournalDamagedError
from local_stack.seed import GROUP_NAME, GROUP_QUOTA_BYTES, STORAGE_NAME, seed_defaults
from tests.helpers import serialize_transactions
from tests.integration.control.harness import register_request

TABLE = "kvcm-control-test"


def control_plane(client) -> ControlPlane:
    return ControlPlane(dynamodb=lambda: client, table_name=TABLE, clock=ManualClock())


def test_snapshot_restores_every_item_into_an_empty_table(aws, tmp_path):
    dynamodb = boto3.client("dynamodb")
    ensure_table(dynamodb, TABLE)
    seed_defaults(control_plane(dynamodb), tmp_path / "data")
    dynamodb.put_item(
        TableName=TABLE,
        Item={
            "pk": {"S": "TEST"},
            "sk": {"S": "binary"},
            "b": {"B": b"\x00\xff"},
            "bs": {"BS": [b"\x01", b"\x02"]},
            "m": {"M": {"l": {"L": [{"B": b"\x03"}, {"N": "7"}]}}},
        },
    )
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


def _items(dynamodb) -> list[dict]:
    return sorted(
        dynamodb.scan(TableName=TABLE, ConsistentRead=True)["Items"],
        key=lambda item: (item["pk"]["S"], item["sk"]["S"]),
    )


def _reset(aws: str, dynamodb) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{aws}/moto-api/reset", method="POST")).read()
    ensure_table(dynamodb, TABLE)


def test_every_acknowledged_write_is_in_the_journal_before_the_answer(aws, tmp_path):
    dynamodb = boto3.client("dynamodb")
    ensure_table(dynamodb, TABLE)
    snapshot = ControlSnapshot(dynamodb, TABLE, tmp_path / "control.json")
    snapshot.attach()
    try:
        control = control_plane(dynamodb)
        seed_defaults(control, tmp_path / "data")  # transactions
        control.add_account("alice", "pw-alice-1", Role.ROLE_USER)
        control.add_account("bob", "pw-bob-12", Role.ROLE_USER)
        control.delete_account("alice")
        control.set_storage_available(STORAGE_NAME, False)  # SET #ver = #ver + :one
        key = {"pk": {"S": "TEST"}, "sk": {"S": "binary"}}
        dynamodb.put_item(TableName=TABLE, Item={**key, "b": {"B": b"\x00\xff"}, "bs": {"BS": [b"\x01"]}})
        dynamodb.update_item(
            TableName=TABLE,
            Key=key,
            UpdateExpression="SET m = :m",
            ExpressionAttributeValues={":m": {"M": {"l": {"L": [{"B": b"\x03"}]}}}},
        )
        dynamodb.batch_write_item(
            RequestItems={
                TABLE: [{"PutRequest": {"Item": {"pk": {"S": "TEST"}, "sk": {"S": f"item-{n}"}}}} for n in range(3)]
            }
        )
        dynamodb.delete_item(TableName=TABLE, Key={"pk": {"S": "TEST"}, "sk": {"S": "item-1"}})
        with pytest.raises(dynamodb.exceptions.ConditionalCheckFailedException):
            dynamodb.put_item(TableName=TABLE, Item=key, ConditionExpression="attribute_not_exists(pk)")
        written = _items(dynamodb)
        # Nothing was ever saved: all of it is in the journal, as a crash would leave it.
        assert not snapshot.path.exists()
    finally:
        snapshot.detach()

    _reset(aws, dynamodb)
    assert ControlSnapshot(dynamodb, TABLE, snapshot.path).restore() == len(written)
    assert _items(dynamodb) == written
    assert control_plane(dynamodb).verify_account("alice", "pw-alice-1") is None
    assert control_plane(dynamodb).get_storage(STORAGE_NAME).version == 2


def test_a_journal_line_cut_short_by_a_crash_is_ignored_a_damaged_one_is_not(aws, tmp_path):
    dynamodb = boto3.client("dynamodb")
    ensure_table(dynamodb, TABLE)
    snapshot = ControlSnapshot(dynamodb, TABLE, tmp_path / "control.json")
    snapshot.attach()
    try:
        dynamodb.put_item(TableName=TABLE, Item={"pk": {"S": "TEST"}, "sk": {"S": "a"}})
    finally:
        snapshot.detach()
    complete = snapshot.journal_path.read_bytes()
    snapshot.journal_path.write_bytes(complete + b'{"key": {"pk"')
    _reset(aws, dynamodb)
    assert snapshot.restore() == 1

    snapshot.journal_path.write_bytes(b'{"key": {"pk"\n' + complete)
    with pytest.raises(JournalDamagedError, match="damaged at line 1"):
        snapshot.restore()


def test_saving_folds_the_journal_into_the_snapshot(aws, tmp_path):
    dynamodb = boto3.client("dynamodb")
    ensure_table(dynamodb, TABLE)
    snapshot = ControlSnapshot(dynamodb, TABLE, tmp_path / "control.json")
    snapshot.attach()
    try:
        dynamodb.put_item(TableName=TABLE, Item={"pk": {"S": "TEST"}, "sk": {"S": "a"}})
        snapshot.compact_if_grown(limit_bytes=1 << 20)
        assert snapshot.journal_path.stat().st_size > 0  # below the limit: kept
        snapshot.compact_if_grown(limit_bytes=0)
        assert snapshot.journal_path.stat().st_size == 0
        dynamodb.delete_item(TableName=TABLE, Key={"pk": {"S": "TEST"}, "sk": {"S": "a"}})
    finally:
        snapshot.detach()
    _reset(aws, dynamodb)
    assert snapshot.restore() == 0  # the snapshot has the item, the journal its deletion


def test_the_snapshot_and_the_journal_are_the_owners_only(aws, tmp_path):
    """Issue 28.16: they hold accounts' password hashes and API key digests."""
    dynamodb = boto3.client("dynamodb")
    ensure_table(dynamodb, TABLE)
    old_journal = tmp_path / "control.journal"
    old_journal.write_text("")
    old_journal.chmod(0o644)  # as an older version left it
    snapshot = ControlSnapshot(dynamodb, TABLE, tmp_path / "control.json")
    snapshot.attach()
    try:
        dynamodb.put_item(TableName=TABLE, Item={"pk": {"S": "TEST"}, "sk": {"S": "a"}})
        snapshot.save()
    finally:
        snapshot.detach()
    assert (tmp_path / "control.json").stat().st_mode & 0o777 == 0o600
    assert snapshot.journal_path.stat().st_mode & 0o777 == 0o600


def test_valkey_files_are_the_owners_only(tmp_path):
    import redis

    from local_stack.valkey import LocalValkey

    valkey = LocalValkey(tmp_path)
    url = valkey.start()
    try:
        redis.Redis.from_url(url).set("k", "v")
    finally:
        valkey.stop()
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".conf" and p.name != "valkey.log"]
    assert files and {p.name: p.stat().st_mode & 0o777 for p in files} == {p.name: 0o600 for p in files}


def test_the_seeded_default_group_caps_its_instances_atomically(aws, tmp_path, monkeypatch):
    """Issue 28.12: `default` took any number of instances (673 slowed every background
    round). Its cap is checked in the transaction that counts the instance: 8 racing
    registrations under a cap of 3 leave exactly 3."""
    serialize_transactions(monkeypatch)  # as DynamoDB does; moto does not
    dynamodb = boto3.client("dynamodb")
    ensure_table(dynamodb, TABLE)
    control = control_plane(dynamodb)
    seed_defaults(control, tmp_path / "data", max_instances=3)
    assert control.get_group(GROUP_NAME).max_instance_count == 3

    def register(n: int) -> str:
        try:
            control.register_instance(register_request(f"engine-{n}", GROUP_NAME))
        except CapacityExceededError:
            return "refused"
        return "registered"

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(register, range(8)))
    assert sorted(outcomes) == ["refused"] * 5 + ["registered"] * 3
    assert len(control.list_instances(GROUP_NAME)) == 3
