"""ControlPlane against a real (moto) DynamoDB table."""

import threading

import pytest

from chalicelib.control import EntityInUseError, UnknownEntityError, VersionConflictError
from chalicelib.control.errors import InstanceRemovingError
from chalicelib.protocol.codes import Role
from chalicelib.protocol.errors import (
    CapacityExceededError,
    DuplicateEntityError,
    InstanceNotFoundError,
    InvalidArgumentError,
)
from chalicelib.protocol.models import StorageConfig

from .harness import add_storages, group, nfs, register_request, table_items


def storage(name, root="/mnt/kvcm"):
    return StorageConfig.model_validate(nfs(name, root))


# ---------------------------------------------------------------- storages


def test_duplicate_storage_is_refused_and_the_original_kept(control):
    control.add_storage(storage("nfs1", "/first"))
    with pytest.raises(DuplicateEntityError, match="storage 'nfs1' already exists"):
        control.add_storage(storage("nfs1", "/second"))
    assert control.get_storage("nfs1").config.nfs.root_path == "/first"


def test_enable_disable_update_bump_the_version(control):
    control.add_storage(storage("nfs1"))
    control.set_storage_available("nfs1", False)
    assert not control.get_storage("nfs1").available
    control.update_storage(storage("nfs1", "/moved"))
    record = control.get_storage("nfs1")
    assert (record.available, record.version, record.config.nfs.root_path) == (False, 3, "/moved")


def test_update_refuses_a_type_change_unless_forced(control):
    control.add_storage(storage("st"))
    s3 = StorageConfig.model_validate({"global_unique_name": "st", "s3": {"bucket": "b"}})
    with pytest.raises(InvalidArgumentError, match="from ST_NFS to ST_S3; set force_update"):
        control.update_storage(s3)
    assert control.get_storage("st").config.nfs is not None
    control.update_storage(s3, force=True)
    assert control.get_storage("st").config.s3.bucket == "b"


@pytest.mark.parametrize(
    "action",
    [
        lambda c: c.set_storage_available("ghost", True),
        lambda c: c.remove_storage("ghost"),
        lambda c: c.update_storage(storage("ghost")),
        lambda c: c.get_storage("ghost"),
    ],
)
def test_unknown_storage_is_named(control, action):
    with pytest.raises(UnknownEntityError, match="storage 'ghost' does not exist"):
        action(control)


def test_storage_used_by_a_group_cannot_be_removed_until_no_group_lists_it(control):
    control.add_storage(storage("nfs1"))
    control.add_storage(storage("nfs2"))
    control.create_group(group("g1", "nfs1", "nfs2"))
    control.create_group(group("g2", "nfs1"))
    with pytest.raises(EntityInUseError, match="instance group\\(s\\) 'g1', 'g2'"):
        control.remove_storage("nfs1")
    control.update_group(group("g1", "nfs2"), current_version=1)
    control.remove_group("g2")
    control.remove_storage("nfs1")
    with pytest.raises(EntityInUseError, match="'g1'"):
        control.remove_storage("nfs2")
    assert [s.name for s in control.list_storages()] == ["nfs2"]


def test_candidates_must_name_storages_that_exist(control, runtime):
    """A group naming a storage not added yet is refused on create and on update, naming the
    candidate, and nothing is written (no group, no reference on either storage)."""
    control.add_storage(storage("nfs1"))
    before = table_items(runtime, "GROUP"), table_items(runtime, "STORAGE_REF")
    with pytest.raises(InvalidArgumentError, match=r"'instance_group.storage_candidates\[0\]' names storage 'later'"):
        control.create_group(group("g1", "later", "nfs1"))
    assert (table_items(runtime, "GROUP"), table_items(runtime, "STORAGE_REF")) == before
    control.add_storage(storage("later"))
    control.create_group(group("g1", "later", "nfs1"))
    with pytest.raises(InvalidArgumentError, match=r"'instance_group.storage_candidates\[1\]' names storage 'gone'"):
        control.update_group(group("g1", "nfs1", "gone"), current_version=1)
    assert control.get_group("g1").storage_candidates == ["later", "nfs1"]
    control.set_storage_available("later", False)
    assert [(c.global_unique_name, a) for c, a in control.storages_for_group("g1")] == [
        ("later", False),
        ("nfs1", True),
    ]
    with pytest.raises(EntityInUseError):
        control.remove_storage("later")


@pytest.mark.parametrize("round_", range(4))
def test_a_group_created_while_its_storage_is_removed_never_names_a_removed_storage(control, round_):
    """createInstanceGroup and removeStorage race on one storage: exactly one of them wins,
    so a group never lists a storage that is gone (the existence check is in the write)."""
    control.add_storage(storage("nfs1"))
    outcomes, barrier = {}, threading.Barrier(2)

    def create():
        barrier.wait()
        try:
            control.create_group(group("g1", "nfs1"))
            outcomes["create"] = "won"
        except InvalidArgumentError:
            outcomes["create"] = "lost"

    def remove():
        barrier.wait()
        try:
            control.remove_storage("nfs1")
            outcomes["remove"] = "won"
        except EntityInUseError:
            outcomes["remove"] = "lost"

    threads = [threading.Thread(target=create), threading.Thread(target=remove)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes.values()) == ["lost", "won"]
    storages = [s.config.global_unique_name for s in control.list_storages()]
    groups = [g.name for g in control.list_groups()]
    assert (storages, groups) == ((["nfs1"], ["g1"]) if outcomes["create"] == "won" else ([], []))


# ---------------------------------------------------------------- groups


def test_group_create_fills_defaults_and_refuses_duplicates(control):
    add_storages(control)
    created = control.create_group(group("g1"))
    assert created.version == 1
    stored = control.get_group("g1")
    assert stored == created and stored.cache_config.reclaim_strategy.trigger_strategy.used_percentage == 0.9
    with pytest.raises(DuplicateEntityError, match="instance group 'g1' already exists"):
        control.create_group(group("g1", "other"))
    assert control.get_group("g1").storage_candidates == ["nfs1"]


def test_update_is_optimistic_on_version(control):
    add_storages(control)
    control.create_group(group("g1"))
    with pytest.raises(VersionConflictError, match="at version 1, not current_version 0"):
        control.update_group(group("g1", user_data="x"), current_version=0)
    with pytest.raises(VersionConflictError, match="must be greater than the stored version 1"):
        control.update_group(group("g1", version=1), current_version=1)
    assert control.update_group(group("g1", user_data="a"), current_version=1).version == 2
    assert control.update_group(group("g1", user_data="b", version=10), current_version=2).version == 10
    with pytest.raises(VersionConflictError):
        control.update_group(group("g1", user_data="stale"), current_version=2)
    stored = control.get_group("g1")
    assert (stored.version, stored.user_data) == (10, "b")
    with pytest.raises(UnknownEntityError, match="instance group 'nope' does not exist"):
        control.update_group(group("nope"), current_version=1)


@pytest.mark.parametrize("round_", range(4))
def test_concurrent_updates_from_the_same_version_exactly_one_wins(control, round_):
    add_storages(control)
    control.create_group(group("g1"))
    results, barrier = [], threading.Barrier(2)

    def update(tag):
        barrier.wait()
        try:
            control.update_group(group("g1", user_data=tag), current_version=1)
            results.append(("won", tag))
        except VersionConflictError:
            results.append(("lost", tag))

    threads = [threading.Thread(target=update, args=(tag,)) for tag in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [tag for outcome, tag in results if outcome == "won"]
    assert len(winners) == 1 and len(results) == 2
    stored = control.get_group("g1")
    assert (stored.version, stored.user_data) == (2, winners[0])


def test_group_with_members_cannot_be_removed(control):
    add_storages(control)
    control.create_group(group("g1"))
    control.register_instance(register_request("i1"))
    with pytest.raises(EntityInUseError, match="instance group 'g1' still has 1 registered instance"):
        control.remove_group("g1")
    control.remove_instance("i1", control.get_instance("i1").incarnation)
    control.remove_group("g1")
    with pytest.raises(UnknownEntityError):
        control.get_group("g1")
    with pytest.raises(UnknownEntityError):
        control.remove_group("g1")


# ---------------------------------------------------------------- instances


def test_register_is_idempotent_and_ignores_user_data(control, runtime):
    add_storages(control)
    control.create_group(group("g1"))
    first = control.register_instance(register_request("i1", user_data="one"))
    again = control.register_instance(register_request("i1", user_data="two"))
    assert again == first and again.model_deployment.user_data == "one"
    assert [r.instance_id for r in control.list_instances("g1")] == ["i1"]
    assert int(table_items(runtime, "GROUP")[0]["instance_count"]) == 1


def test_register_same_id_with_another_config_is_a_duplicate(control):
    add_storages(control)
    control.create_group(group("g1"))
    control.create_group(group("g2"))
    control.register_instance(register_request("i1"))
    with pytest.raises(DuplicateEntityError, match="different block_size"):
        control.register_instance(register_request("i1", block_size=32))
    with pytest.raises(DuplicateEntityError, match="different instance_group"):
        control.register_instance(register_request("i1", group_name="g2"))
    assert control.get_instance("i1").block_size == 16


def test_register_in_unknown_group_and_over_max_instance_count(control):
    add_storages(control)
    with pytest.raises(UnknownEntityError, match="instance group 'nope' does not exist"):
        control.register_instance(register_request("i1", group_name="nope"))
    assert control.get_instance("i1") is None
    control.create_group(group("g1", max_instance_count=2))
    control.register_instance(register_request("i1"))
    control.register_instance(register_request("i2"))
    with pytest.raises(CapacityExceededError, match="maximum of 2 instance"):
        control.register_instance(register_request("i3"))
    assert control.get_instance("i3") is None
    control.remove_instance("i1", control.get_instance("i1").incarnation)
    control.register_instance(register_request("i3"))


def test_concurrent_registrations_respect_max_instance_count(control):
    add_storages(control)
    control.create_group(group("g1", max_instance_count=3))
    outcomes, barrier = [], threading.Barrier(6)

    def register(i):
        barrier.wait()
        try:
            control.register_instance(register_request(f"i{i}"))
            outcomes.append("ok")
        except CapacityExceededError:
            outcomes.append("full")

    threads = [threading.Thread(target=register, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["full"] * 3 + ["ok"] * 3
    assert len(control.list_instances("g1")) == 3


def test_remove_instance(control):
    """Removal begins (the record is marked, the id stays taken, listings skip it) and
    ends with the record deleted for the incarnation that began it."""
    add_storages(control)
    control.create_group(group("g1"))
    control.create_group(group("g2"))
    registered = control.register_instance(register_request("i1"))
    with pytest.raises(InvalidArgumentError, match="belongs to instance group 'g1'"):
        control.begin_instance_removal("i1", group="g2")
    marked = control.begin_instance_removal("i1", group="g1")
    assert marked.removing_us > 0 and control.begin_instance_removal("i1") == marked  # idempotent
    assert control.list_instances("g1") == [] and control.list_instances("g1", removing=True) == [marked]
    with pytest.raises(InstanceRemovingError, match="being removed"):
        control.register_instance(register_request("i1"))
    with pytest.raises(InstanceNotFoundError):
        control.remove_instance("i1", "another-incarnation")
    assert control.remove_instance("i1", registered.incarnation).instance_id == "i1"
    assert control.get_instance("i1") is None
    with pytest.raises(InstanceNotFoundError):
        control.begin_instance_removal("i1")
    control.register_instance(register_request("i1"))  # the id is free again


def test_list_instances_by_group(control):
    add_storages(control)
    control.create_group(group("g1"))
    control.create_group(group("g2"))
    for instance_id, group_name in (("b", "g1"), ("a", "g2"), ("c", "g1")):
        control.register_instance(register_request(instance_id, group_name=group_name))
    assert [r.instance_id for r in control.list_instances("g1")] == ["b", "c"]
    assert [r.instance_id for r in control.list_instances()] == ["a", "b", "c"]


# ---------------------------------------------------------------- accounts


def test_accounts_store_only_salted_hashes(control, runtime):
    control.add_account("alice", "wonderland-42", Role.ROLE_ADMIN)
    control.add_account("bob", "builder-12345", Role.ROLE_USER, groups=["g1"], instance_prefixes=["bob-"])
    with pytest.raises(DuplicateEntityError):
        control.add_account("alice", "other-password", Role.ROLE_USER)
    raw = {item["sk"]: item for item in table_items(runtime, "ACCOUNT")}
    assert "wonderland" not in repr(raw) and raw["alice"]["password"].startswith("scrypt$")
    assert "password" not in raw["bob"]  # only admin accounts keep one (bootstrap); the others use API keys
    assert [(a.user_name, a.role, a.instance_groups, a.instance_id_prefixes) for a in control.list_accounts()] == [
        ("alice", Role.ROLE_ADMIN, ["*"], []),
        ("bob", Role.ROLE_USER, ["g1"], ["bob-"]),
    ]
    assert control.verify_account("alice", "wonderland-42").role == Role.ROLE_ADMIN
    assert control.verify_account("alice", "other") is None
    assert control.verify_account("nobody", "wonderland-42") is None
    assert control.verify_account("bob", "builder-12345") is None
    control.delete_account("alice")
    assert control.verify_account("alice", "wonderland-42") is None
    with pytest.raises(UnknownEntityError, match="account 'alice' does not exist"):
        control.delete_account("alice")


def test_api_keys_are_stored_hashed_and_go_with_their_account(control, runtime, clock):
    control.add_account("eng", "", Role.ROLE_USER)
    api_key, record = control.create_api_key("eng", ttl_s=60)
    assert api_key.startswith(f"kvcm_{record.key_id}.") and len(api_key) == 5 + 16 + 1 + 43
    assert record.expires_us - record.created_us == 60_000_000
    raw = table_items(runtime, "API_KEY")
    assert api_key.split(".")[1] not in repr(raw) and raw[0]["digest"] == record.digest
    assert control.get_api_key(record.key_id) == record
    with pytest.raises(UnknownEntityError, match="account 'ghost'"):
        control.create_api_key("ghost", ttl_s=60)
    control.delete_account("eng")
    assert table_items(runtime, "API_KEY") == []


def test_every_write_bumps_the_epoch_and_refused_writes_do_not(control):
    start = control.epoch()
    control.add_storage(storage("nfs1"))
    control.create_group(group("g1", "nfs1"))
    assert control.epoch() == start + 2
    with pytest.raises(DuplicateEntityError):
        control.add_storage(storage("nfs1"))
    with pytest.raises(EntityInUseError):
        control.remove_storage("nfs1")
    assert control.epoch() == start + 2
