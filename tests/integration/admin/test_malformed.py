"""Malformed input to every AdminService method: the contract's code, a message naming the
field, and nothing half-written."""

import pytest

from chalicelib.protocol.codes import Role
from chalicelib.routes.admin import OPERATIONS
from tests.integration.control.harness import group, group_json, message, nfs, post, register_request, snapshot

VALID_GROUP = group_json("g2", "nfs1")

# method -> [(body, text the message must contain)]
CASES = {
    "addStorage": [
        ({}, "field 'storage' is required"),
        ({"storage": 5}, "field 'storage'"),
        ({"storage": {"global_unique_name": 5, "nfs": {}}}, "field 'storage.global_unique_name'"),
        ({"storage": {"nfs": {"root_path": "/x"}}}, "field 'storage.global_unique_name' is required"),
        ({"storage": {"global_unique_name": "a"}}, "field 'storage' must set one of"),
        (
            {"storage": {"global_unique_name": "a", "nfs": {"root_path": "/x"}, "s3": {"bucket": "b"}}},
            "field 'storage'",
        ),
        (
            {"storage": {"global_unique_name": "a", "nfs": {"root_path": "/x", "key_count_per_file": "many"}}},
            "field 'storage.nfs.key_count_per_file'",
        ),
        (
            {"storage": {"global_unique_name": "a", "check_storage_available_when_open": "yes", "nfs": {}}},
            "field 'storage.check_storage_available_when_open'",
        ),
        ({"storage": nfs("nfs1")}, "storage 'nfs1' already exists"),
    ],
    "enableStorage": [
        ({}, "field 'storage_unique_name' is required"),
        ({"storage_unique_name": 7}, "field 'storage_unique_name'"),
        ({"storage_unique_name": "ghost"}, "storage 'ghost' does not exist"),
    ],
    "disableStorage": [
        ({}, "field 'storage_unique_name' is required"),
        ({"storageUniqueName": ["nfs1"]}, "field 'storage_unique_name'"),
    ],
    "removeStorage": [
        ({}, "field 'storage_unique_name' is required"),
        ({"storage_unique_name": None}, "field 'storage_unique_name'"),
        ({"storage_unique_name": "nfs1"}, "is a storage candidate of instance group(s) 'g1'"),
    ],
    "updateStorage": [
        ({}, "field 'storage' is required"),
        ({"storage": nfs("nfs1"), "force_update": "yes"}, "field 'force_update'"),
        ({"storage": {"global_unique_name": "nfs1"}}, "field 'storage' must set one of"),
        ({"storage": {"global_unique_name": "nfs1", "s3": {"bucket": "b"}}}, "set force_update"),
        ({"storage": nfs("ghost")}, "storage 'ghost' does not exist"),
    ],
    "listStorage": [({"trace_id": 5}, "field 'trace_id'")],
    "createInstanceGroup": [
        ({}, "field 'instance_group' is required"),
        ({"instance_group": []}, "field 'instance_group'"),
        ({"instance_group": {"name": "g2"}}, "field 'instance_group.storage_candidates'"),
        ({"instance_group": {"name": "g2", "storage_candidates": "nfs1"}}, "field 'instance_group.storage_candidates'"),
        (
            {"instance_group": {**VALID_GROUP, "max_instance_count": "lots"}},
            "field 'instance_group.max_instance_count'",
        ),
        (
            {"instance_group": {**VALID_GROUP, "cache_config": {"reclaim_strategy": {"reclaim_policy": "POLICY_MRU"}}}},
            "field 'instance_group.cache_config.reclaim_strategy.reclaim_policy'",
        ),
        (
            {"instance_group": {**VALID_GROUP, "cache_config": {"data_storage_strategy": 55}}},
            "field 'instance_group.cache_config.data_storage_strategy'",
        ),
        (
            {"instance_group": {**VALID_GROUP, "quota": {"quota_config": [{"storage_type": "ST_FLOPPY"}]}}},
            "field 'instance_group.quota.quota_config[0].storage_type'",
        ),
        (
            {
                "instance_group": {
                    **VALID_GROUP,
                    "cache_config": {"reclaim_strategy": {"trigger_strategy": {"used_percentage": -0.5}}},
                }
            },
            "field 'instance_group.cache_config.reclaim_strategy.trigger_strategy.used_percentage'",
        ),
        ({"instance_group": group_json("g1", "nfs9")}, "instance group 'g1' already exists"),
    ],
    "updateInstanceGroup": [
        ({"current_version": 1}, "field 'instance_group' is required"),
        ({"instance_group": group_json("g1", "nfs1"), "current_version": "one"}, "field 'current_version'"),
        (
            {"instance_group": {**group_json("g1", "nfs1"), "quota": {"capacity": -1}}, "current_version": 1},
            "field 'instance_group.quota.capacity'",
        ),
        ({"instance_group": group_json("g1", "nfs2"), "current_version": 7}, "not current_version 7"),
    ],
    "removeInstanceGroup": [
        ({}, "field 'name' is required"),
        ({"name": 1}, "field 'name'"),
        ({"name": "g1"}, "instance group 'g1' still has 1 registered instance"),
    ],
    "getInstanceGroup": [({}, "field 'name' is required"), ({"name": {}}, "field 'name'")],
    "getGroupHitCurve": [
        ({}, "field 'name' is required"),
        ({"name": 7}, "field 'name'"),
        ({"name": "ghost"}, "instance group 'ghost' does not exist"),
    ],
    "resetGroupHitCurve": [
        ({}, "field 'name' is required"),
        ({"name": 7}, "field 'name'"),
        ({"name": "ghost"}, "instance group 'ghost' does not exist"),
    ],
    "listInstanceGroup": [({"header": {"trace_id": 1}}, "field 'header.trace_id'")],
    "removeInstance": [
        ({}, "field 'instance_id' is required"),
        ({"instance_id": 3}, "field 'instance_id'"),
        ({"instance_id": "i1", "instance_group": "g2"}, "field 'instance_group'"),
    ],
    "migrateCache": [
        ({}, "field 'instance_id' is required"),
        ({"instance_id": 5}, "field 'instance_id'"),
        ({"instance_id": "i1", "block_keys": [1]}, "field 'method' is required"),
        ({"instance_id": "i1", "method": "MIGRATION_METHOD_TELEPORT"}, "field 'method'"),
        (
            {"instance_id": "i1", "method": "MIGRATION_METHOD_MARK", "block_keys": [1]},
            "field 'method': MIGRATION_METHOD_MARK needs a migration strategy in group 'g1'",
        ),
        (
            {"instance_id": "i1", "method": 3, "block_keys": [1]},
            "field 'method': MIGRATION_METHOD_BOTH needs a migration strategy in group 'g1'",
        ),
        ({"instance_id": "i1", "method": "MIGRATION_METHOD_COPY"}, "field 'block_keys' is required"),
        (
            {"instance_id": "i1", "method": 1, "rule": {"sample_count": 4097}},
            "field 'rule.sample_count': 4097, at most 4096",
        ),
        ({"instance_id": "i1", "method": 1, "rule": {"sample_count": "many"}}, "field 'rule.sample_count'"),
        ({"instance_id": "i1", "method": 1, "block_keys": "1,2"}, "field 'block_keys'"),
        (
            {"instance_id": "i1", "method": 1, "block_keys": list(range(4097))},
            "field 'block_keys': 4097 keys, at most 4096",
        ),
        ({"instance_id": "i1", "method": 1, "block_keys": [1]}, "field 'source_storage_name' is required"),
        (
            {"instance_id": "i1", "method": 1, "block_keys": [1], "source_storage_name": "ghost"},
            "field 'source_storage_name': 'ghost' is not a storage candidate of group 'g1'",
        ),
        (
            {"instance_id": "i1", "method": 1, "block_keys": [1], "source_storage_name": "nfs1"},
            "field 'target_storage_name' is required",
        ),
        (
            {
                "instance_id": "i1",
                "method": 1,
                "block_keys": [1],
                "source_storage_name": "nfs1",
                "target_storage_name": "s3x",
            },
            "field 'target_storage_name': 's3x' is not a storage candidate of group 'g1'",
        ),
        (
            {
                "instance_id": "i1",
                "method": 1,
                "block_keys": [1],
                "source_storage_name": "nfs1",
                "target_storage_name": "nfs1",
            },
            "field 'target_storage_name' must differ from source_storage_name",
        ),
        ({"instance_id": "ghost", "method": 1, "block_keys": [1]}, "ghost"),
    ],
    "listAsyncCopyQuarantine": [
        ({"instance_group_name": 3}, "field 'instance_group_name'"),
        ({"instance_group_name": "ghost"}, "field 'instance_group_name': instance group 'ghost' does not exist"),
    ],
    "breakGlassReleaseAsyncCopy": [
        ({}, "field 'operation_id' is required"),
        ({"operation_id": 5}, "field 'operation_id'"),
        ({"operation_id": "copy-x-0"}, "field 'operator_name' is required"),
        ({"operation_id": "copy-x-0", "operator_name": "alice"}, "field 'external_fencing_evidence' is required"),
        (
            {"operation_id": "copy-x-0", "operator_name": "alice", "external_fencing_evidence": "fenced"},
            "field 'external_fencing_confirmed' must be true",
        ),
        (
            {
                "operation_id": "copy-x-0",
                "operator_name": "alice",
                "external_fencing_evidence": "fenced",
                "external_fencing_confirmed": "maybe",
            },
            "field 'external_fencing_confirmed'",
        ),
        (
            {
                "operation_id": "copy-x-0",
                "operator_name": "alice",
                "external_fencing_evidence": "fenced",
                "external_fencing_confirmed": True,
                "guard_state": 9,
            },
            "field 'guard_state': 9 is not a guard state",
        ),
        (
            {
                "operation_id": "copy-x-0",
                "operator_name": "alice",
                "external_fencing_evidence": "fenced",
                "external_fencing_confirmed": True,
            },
            "field 'operation_id': 'copy-x-0' is not a quarantined copy operation",
        ),
    ],
    "listInstanceInfo": [({"instance_group_name": 3}, "field 'instance_group_name'")],
    "addAccount": [
        ({"password": "p"}, "field 'user_name' is required"),
        ({"user_name": "carol", "role": "ROLE_ADMIN"}, "field 'password' is required"),
        ({"user_name": "carol", "password": "short", "role": "ROLE_ADMIN"}, "field 'password' must have at least"),
        ({"user_name": "carol", "password": "p", "role": "ROLE_ROOT"}, "field 'role'"),
        ({"user_name": "carol", "password": "p", "role": 7}, "field 'role'"),
        ({"user_name": "ca:rol", "password": "p"}, "field 'user_name' must not contain ':'"),
        ({"user_name": "carol", "instance_groups": ["g}"]}, "field 'instance_groups[0]'"),
        ({"user_name": "carol", "instance_id_prefixes": ["a b"]}, "field 'instance_id_prefixes[0]'"),
        ({"user_name": "alice", "password": "p"}, "account 'alice' already exists"),
    ],
    "createApiKey": [
        ({}, "field 'user_name' is required"),
        ({"user_name": "ghost"}, "account 'ghost' does not exist"),
        ({"user_name": "alice", "expire_seconds": -1}, "field 'expire_seconds'"),
        ({"user_name": "alice", "expire_seconds": 10**12}, "field 'expire_seconds'"),
    ],
    "revokeApiKey": [({}, "field 'key_id' is required"), ({"key_id": "0123456789abcdef"}, "does not exist")],
    "listApiKey": [({"user_name": 5}, "field 'user_name'")],
    "listAuditLog": [({"limit": 5000}, "field 'limit'"), ({"start_time_ms": "soon"}, "field 'start_time_ms'")],
    "getInstanceGroupUsage": [
        ({"instance_group_name": 5}, "field 'instance_group_name'"),
        ({"instance_group_name": "ghost"}, "instance group 'ghost' does not exist"),
    ],
    "getCapacityReport": [({"trace_id": 5}, "field 'trace_id'")],
    "deleteAccount": [
        ({}, "field 'user_name' is required"),
        ({"user_name": False}, "field 'user_name'"),
        ({"user_name": "ghost"}, "account 'ghost' does not exist"),
    ],
    "listAccount": [({"trace_id": []}, "field 'trace_id'")],
    "getMetrics": [({"trace_id": {}}, "field 'trace_id'")],
    "checkHealth": [({"header": "x"}, "field 'header'")],
    "getManagerClusterInfo": [({"trace_id": 1.5}, "field 'trace_id'")],
    "leaderDemote": [({"trace_id": True}, "field 'trace_id'")],
    "getLeaderElectorConfig": [({"trace_id": 0}, "field 'trace_id'")],
    "updateLeaderElectorConfig": [
        ({"campaign_delay_time_ms": "soon"}, "field 'campaign_delay_time_ms'"),
        ({"campaign_delay_time_ms": -5}, "field 'campaign_delay_time_ms' must be >= 0"),
        ({"campaign_delay_time_ms": 2**63}, "field 'campaign_delay_time_ms'"),
    ],
    "updateLogger": [
        ({}, "field 'log_level' is required"),
        ({"log_level": "LOUD"}, "field 'log_level'"),
        ({"log_level": 3}, "field 'log_level'"),
    ],
}
METHODS = sorted(op.api_name for op in OPERATIONS)


def expected_code(text: str) -> str:
    if "not supported yet" in text:
        return "UNSUPPORTED"
    if text == "ghost":
        return "INSTANCE_NOT_EXIST"
    return "DUPLICATE_ENTITY" if "already exists" in text else "INVALID_ARGUMENT"


def test_every_admin_method_has_malformed_cases():
    assert sorted(CASES) == METHODS


@pytest.fixture
def populated(client, control, request):
    """State that refused calls must leave exactly as it is (an account only where it
    matters: hashing its password is the slowest step here)."""
    from chalicelib.protocol.models import StorageConfig

    control.add_storage(StorageConfig.model_validate(nfs("nfs1")))
    control.create_group(group("g1", "nfs1"))
    control.register_instance(register_request("i1"))
    if "Account" in request.node.callspec.params["method"] or "ApiKey" in request.node.callspec.params["method"]:
        control.add_account("alice", "secret-pass-1", Role.ROLE_ADMIN)
    return client


@pytest.mark.parametrize("method", METHODS)
def test_non_object_bodies_are_http_400_with_empty_body(client, method):
    for raw in ("{not json", "[1, 2]", '"text"', "42", "null", "\xff"):
        assert post(client, method, raw=raw) == (400, {}), raw


@pytest.mark.parametrize("method", METHODS)
def test_malformed_fields_are_named_and_nothing_is_written(populated, runtime, method):
    before = snapshot(runtime)
    for body, expected in CASES[method]:
        status, data = post(populated, method, body)
        assert status == 200, (body, data)
        assert data["header"]["status"]["code"] == expected_code(expected), (body, data)
        assert expected in message(data), (body, message(data))
        assert snapshot(runtime) == before, body
