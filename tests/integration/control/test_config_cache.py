"""ConfigCache: no DynamoDB reads when warm, epoch-driven refresh, negatives, staleness bounds."""

import threading

import pytest

from chalicelib.control import ConfigCache, ControlPlane, UnknownEntityError
from chalicelib.control.table import CHANGE_PK
from chalicelib.protocol.codes import Role
from chalicelib.protocol.errors import InstanceNotFoundError, InvalidArgumentError, ServiceNotReadyError
from chalicelib.protocol.models import StorageConfig

from .harness import TABLE, group, nfs, register_request

REFRESH_S = 2.0


@pytest.fixture
def cache(control, clock):
    return ConfigCache(control, clock=clock, refresh_s=REFRESH_S)


@pytest.fixture
def other(runtime, clock):
    """The control plane as another container sees it (same table, its own objects)."""
    return ControlPlane(dynamodb=lambda: runtime.aws("dynamodb"), table_name=TABLE, clock=clock)


@pytest.fixture
def reads(control, monkeypatch):
    """Counts DynamoDB reads made through ``control`` (a read of change records is a query)."""
    counts = {"get": 0, "query": 0}
    table = control.table
    for name, counter in (("get", "get"), ("query", "query"), ("changes_since", "query")):
        real = getattr(table, name)

        def counted(*args, _real=real, _counter=counter):
            counts[_counter] += 1
            return _real(*args)

        monkeypatch.setattr(table, name, counted)
    return counts


@pytest.fixture
def populated(control):
    control.add_storage(StorageConfig.model_validate(nfs("nfs1")))
    control.add_storage(StorageConfig.model_validate(nfs("nfs2")))
    control.create_group(group("g1", "nfs2", "nfs1"))
    control.register_instance(register_request("i1"))


def test_warm_cache_reads_nothing_until_refresh_is_due(cache, populated, reads, clock):
    assert cache.instance("i1").block_size == 16
    assert cache.group("g1").storage_candidates == ["nfs2", "nfs1"]
    assert [c.global_unique_name for c, _ in cache.storages_for_group("g1")] == ["nfs2", "nfs1"]
    assert cache.storage("nfs1").available
    cold = dict(reads)
    for _ in range(50):
        cache.instance("i1")
        cache.group("g1")
        cache.storages_for_group("g1")
        clock.advance(REFRESH_S / 100)
    assert reads == cold
    clock.advance(REFRESH_S)
    cache.instance("i1")
    assert reads["query"] == cold["query"] + 1  # only the epoch: nothing changed
    assert reads["get"] == cold["get"]


def test_unknowns(cache, populated):
    with pytest.raises(InstanceNotFoundError, match="instance 'ghost' does not exist"):
        cache.instance("ghost")
    with pytest.raises(UnknownEntityError, match="instance group 'nope'"):
        cache.group("nope")
    with pytest.raises(UnknownEntityError, match="instance group 'nope'"):
        cache.storages_for_group("nope")
    with pytest.raises(UnknownEntityError, match="storage 'missing'"):
        cache.storage("missing")
    with pytest.raises(InvalidArgumentError, match="field 'instance_id' is required"):
        cache.instance("")


def test_misses_are_cached_until_the_epoch_moves(cache, populated, other, reads, clock):
    for _ in range(5):
        with pytest.raises(InstanceNotFoundError):
            cache.instance("late")
    instance_reads = reads["get"]
    other.register_instance(register_request("late"))
    with pytest.raises(InstanceNotFoundError):
        cache.instance("late")  # another container's write: seen after refresh_s at most
    assert reads["get"] == instance_reads
    clock.advance(REFRESH_S)
    assert cache.instance("late").instance_id == "late"


def test_own_writes_are_seen_by_the_next_call(cache, populated, control):
    with pytest.raises(InstanceNotFoundError):
        cache.instance("mine")
    control.register_instance(register_request("mine"))
    assert cache.instance("mine").instance_id == "mine"
    control.set_storage_available("nfs1", False)
    assert cache.storages_for_group("g1")[1][1] is False
    control.remove_instance("mine", control.get_instance("mine").incarnation)
    with pytest.raises(InstanceNotFoundError):
        cache.instance("mine")


def test_other_containers_changes_are_seen_within_refresh(cache, populated, other, clock):
    assert cache.storage("nfs2").available and cache.instance("i1")
    other.set_storage_available("nfs2", False)
    other.update_group(group("g1", "nfs1"), current_version=1)
    other.remove_instance("i1", other.get_instance("i1").incarnation)
    clock.advance(REFRESH_S * 0.9)
    assert cache.storage("nfs2").available and cache.instance("i1")
    clock.advance(REFRESH_S * 0.1)
    assert not cache.storage("nfs2").available
    assert cache.storages_for_group("g1") == [(cache.storage("nfs1").config, True)]
    with pytest.raises(InstanceNotFoundError):
        cache.instance("i1")


def test_invalidate_forces_a_reload(cache, populated, reads):
    cache.group("g1")
    before = reads["query"]
    cache.invalidate()
    cache.group("g1")
    assert reads["query"] == before + 4  # the epoch, the recent change records, then storages and groups


def test_serves_cached_data_while_dynamodb_is_unreachable(cache, populated, control, clock, monkeypatch):
    cache.instance("i1")
    cache.group("g1")

    def down(*args):
        raise ServiceNotReadyError("control table unreachable")

    monkeypatch.setattr(control.table, "get", down)
    monkeypatch.setattr(control.table, "query", down)
    clock.advance(REFRESH_S)
    assert cache.instance("i1").instance_id == "i1"
    assert cache.group("g1").name == "g1"
    with pytest.raises(ServiceNotReadyError):
        cache.instance("not-cached")


def test_a_load_racing_with_a_change_is_not_kept(cache, populated, control, monkeypatch):
    real_get_instance = control.get_instance
    stale = real_get_instance("i1")
    calls = []

    def racing_get_instance(instance_id):
        calls.append(instance_id)
        if len(calls) == 1:
            monkeypatch.setattr(control, "get_instance", real_get_instance)
            # the change lands while our read is in flight...
            control.remove_instance("i1", control.get_instance("i1").incarnation)
            cache.group("g1")  # ...and another call sees the new epoch first
            return stale
        return real_get_instance(instance_id)

    monkeypatch.setattr(control, "get_instance", racing_get_instance)
    assert cache.instance("i1") is stale  # the in-flight call answers with what it read
    with pytest.raises(InstanceNotFoundError):
        cache.instance("i1")  # but the stale record was not cached


def test_concurrent_readers_and_writers(cache, populated, control):
    errors = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                cache.instance("i1")
                assert cache.group("g1").name == "g1"
                cache.storages_for_group("g1")
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(5):
        control.set_storage_available("nfs1", i % 2 == 0)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.storage("nfs1").available is True


def test_a_write_drops_only_what_it_changed(cache, populated, other, control, reads, clock):
    """Issue 28.3: another tenant's registration or a new account costs the cache two small
    Queries (epoch, change records), no reload of the catalog or of anything else."""
    control.add_account("alice", "", Role.ROLE_USER)
    _, key = control.create_api_key("alice", 3600)
    clock.advance(REFRESH_S)
    cache.instance("i1"), cache.group("g1"), cache.account("alice"), cache.api_key(key.key_id)
    warm = dict(reads)
    other.create_group(group("g2", "nfs1"))
    clock.advance(REFRESH_S)
    cache.instance("i1"), cache.account("alice"), cache.api_key(key.key_id)
    assert cache.group("g2").name == "g2"  # a group changed: the catalog reloads (2 Queries, the settings item)
    assert (reads["get"], reads["query"]) == (warm["get"] + 1, warm["query"] + 4)
    warm = dict(reads)
    for i in range(3):
        other.register_instance(register_request(f"other-{i}", "g2"))
        other.add_account(f"tenant-{i}", "", Role.ROLE_USER)
    clock.advance(REFRESH_S)
    assert cache.instance("i1").instance_id == "i1" and cache.group("g1").name == "g1"
    assert cache.account("alice") is not None and cache.api_key(key.key_id) is not None
    assert (reads["get"], reads["query"]) == (warm["get"], warm["query"] + 2)
    assert cache.instance("other-1").group == "g2"  # what changed is read afresh
    other.revoke_api_key(key.key_id)
    clock.advance(REFRESH_S)
    assert cache.api_key(key.key_id) is None


def test_changes_without_records_revalidate_what_is_held(cache, populated, other, control, reads, clock):
    """When the change records do not cover every epoch step (expired, or the cache looked
    too long ago), nothing held is trusted: records are re-read on next use, without the
    gate that refuses unknown API keys."""
    control.add_account("alice", "", Role.ROLE_USER)
    _, key = control.create_api_key("alice", 3600)
    cache.instance("i1"), cache.api_key(key.key_id)
    clock.advance(REFRESH_S)
    other.remove_instance("i1", other.get_instance("i1").incarnation)
    table = control.table
    for item in table.query(CHANGE_PK):  # as if DynamoDB's TTL had deleted them
        table.client.delete_item(TableName=table.name, Key={"pk": {"S": CHANGE_PK}, "sk": {"S": item["sk"]}})
    clock.advance(REFRESH_S)
    with pytest.raises(InstanceNotFoundError):
        cache.instance("i1")

    def refuse():
        raise AssertionError("a known key is revalidated without the unknown-key gate")

    assert cache.api_key(key.key_id, before_load=refuse).key_id == key.key_id
