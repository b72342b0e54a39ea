"""Records: storage, round trips, identity, the storage_configs string."""

import json

from chalicelib.control import InstanceRecord, StorageRecord, storage_configs_json
from chalicelib.control.records import candidate_storages
from chalicelib.protocol.models import InstanceGroup, RegisterInstanceRequest, StorageConfig


def record(**overrides) -> InstanceRecord:
    data = {
        "instance_group": "g",
        "instance_id": "i",
        "block_size": 16,
        "location_spec_infos": [{"name": "tp0", "size": 100}, {"name": "tp1", "size": 28}],
        "model_deployment": {"model_name": "m", "dtype": "bf16", "tp_size": 2, "user_data": "u1"},
        "location_spec_groups": [{"name": "first", "spec_names": ["tp0"]}],
    }
    data.update(overrides)
    return InstanceRecord.from_request(RegisterInstanceRequest.model_validate(data), 123, "inc")


def test_doc_round_trip_keeps_every_field():
    original = record()
    again = InstanceRecord.from_doc(original.to_doc())
    assert again == original
    assert again.block_bytes == 128 and again.spec_names == ["tp0", "tp1"]


def test_identity_ignores_user_data_only():
    base = record()
    other_user_data = record(model_deployment={"model_name": "m", "dtype": "bf16", "tp_size": 2, "user_data": "u2"})
    assert base.identity() == other_user_data.identity()
    assert base.identity() != record(block_size=32).identity()
    assert base.identity() != record(instance_group="h").identity()
    assert base.identity() != record(model_deployment={"model_name": "m", "dtype": "fp8", "tp_size": 2}).identity()


def test_instance_info_view():
    info = record().to_instance_info("quota-x")
    assert (info.quota_group_name, info.instance_group_name, info.instance_id, info.block_size) == (
        "quota-x",
        "g",
        "i",
        16,
    )
    assert info.model_deployment.user_data == "u1"


def test_storage_configs_json_lists_candidates_in_order_skipping_missing():
    nfs = StorageConfig.model_validate(
        {"global_unique_name": "nfs1", "nfs": {"root_path": "/r", "key_count_per_file": 2}}
    )
    pool = StorageConfig.model_validate(
        {"global_unique_name": "pool", "tair_mem_pool": {"domain": "d", "capacity": 77}}
    )
    storages = {"nfs1": StorageRecord(nfs, True, 1), "pool": StorageRecord(pool, False, 3)}
    group = InstanceGroup(name="g", storage_candidates=["pool", "not-yet", "nfs1"])
    entries = json.loads(storage_configs_json(candidate_storages(group, storages)))
    assert entries == [
        {
            "type": "pace",
            "is_available": False,
            "global_unique_name": "pool",
            "storage_spec": {"enable_vipserver": False, "domain": "d", "timeout": 0, "service_discovery_url": ""},
        },
        {
            "type": "file",
            "is_available": True,
            "global_unique_name": "nfs1",
            "storage_spec": {"root_path": "/r", "key_count_per_file": 2},
        },
    ]
