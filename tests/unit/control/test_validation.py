"""registerInstance, storage config and account validation."""

import pytest

from chalicelib.control.validation import validate_account, validate_register_request
from chalicelib.protocol.codes import Role
from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.protocol.models import (
    FinishWriteCacheRequest,
    GetCacheLocationRequest,
    RegisterInstanceRequest,
    StorageConfig,
)
from chalicelib.protocol.validation import validate_key_fields, validate_storage_config


def request(**overrides) -> RegisterInstanceRequest:
    data = {
        "instance_group": "g",
        "instance_id": "i",
        "block_size": 16,
        "location_spec_infos": [{"name": "tp0", "size": 10}, {"name": "tp1", "size": 10}],
        "model_deployment": {"model_name": "m", "dtype": "bf16"},
        "location_spec_groups": [{"name": "all", "spec_names": ["tp0", "tp1"]}],
    }
    data.update(overrides)
    return RegisterInstanceRequest.model_validate(data)


def test_a_complete_request_is_valid():
    validate_register_request(request())


@pytest.mark.parametrize(
    "overrides, path",
    [
        ({"instance_group": ""}, "instance_group"),
        ({"instance_id": ""}, "instance_id"),
        ({"instance_id": "a\nb"}, "instance_id"),
        ({"instance_id": "x" * 257}, "instance_id"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": -4}, "block_size"),
        ({"location_spec_infos": []}, "location_spec_infos"),
        ({"location_spec_infos": [{"name": "", "size": 1}]}, "location_spec_infos[0].name"),
        ({"location_spec_infos": [{"name": "a", "size": 0}]}, "location_spec_infos[0].size"),
        (
            {"location_spec_infos": [{"name": "a", "size": 1}, {"name": "a", "size": 1}], "location_spec_groups": []},
            "location_spec_infos[1]",
        ),
        ({"model_deployment": None}, "model_deployment"),
        ({"model_deployment": {"dtype": "bf16"}}, "model_deployment.model_name"),
        ({"model_deployment": {"model_name": "m"}}, "model_deployment.dtype"),
        ({"model_deployment": {"model_name": "m", "dtype": "x", "tp_size": -1}}, "model_deployment.tp_size"),
        ({"location_spec_groups": [{"name": "", "spec_names": ["tp0"]}]}, "location_spec_groups[0].name"),
        ({"location_spec_groups": [{"name": "g", "spec_names": []}]}, "location_spec_groups[0].spec_names"),
        (
            {"location_spec_groups": [{"name": "g", "spec_names": ["tp0", "tp9"]}]},
            "location_spec_groups[0].spec_names[1]",
        ),
        (
            {"location_spec_groups": [{"name": "g", "spec_names": ["tp0", "tp0"]}]},
            "location_spec_groups[0].spec_names[1]",
        ),
        (
            {"location_spec_groups": [{"name": "g", "spec_names": ["tp0"]}, {"name": "g", "spec_names": ["tp1"]}]},
            "location_spec_groups[1]",
        ),
    ],
)
def test_register_rules_name_the_field(overrides, path):
    with pytest.raises(InvalidArgumentError) as err:
        validate_register_request(request(**overrides))
    assert f"field '{path}'" in str(err.value)


@pytest.mark.parametrize(
    "config, message",
    [
        (None, "field 'storage' is required"),
        ({"nfs": {"root_path": "/x"}}, "field 'storage.global_unique_name' is required"),
        ({"global_unique_name": "a"}, "field 'storage' must set one of nfs, threefs"),
    ],
)
def test_storage_config_generic_checks(config, message):
    model = None if config is None else StorageConfig.model_validate(config)
    with pytest.raises(InvalidArgumentError, match=message):
        validate_storage_config(model)


@pytest.mark.parametrize(
    "user, password, path",
    [
        ("", "pw", "user_name"),
        ("a:b", "pw", "user_name"),
        ("alice", "", "password"),
        ("alice", "p" * 1025, "password"),
        ("alice", "short-pw", "password"),
        ("alicealice12", "AliceAlice12", "password"),
        ("alice", "abababababababab", "password"),
    ],
)
def test_admin_credentials(user, password, path):
    with pytest.raises(InvalidArgumentError, match=f"field '{path}'"):
        validate_account(user, password, Role.ROLE_ADMIN, (), ())


def test_other_roles_need_no_password_but_a_safe_scope():
    validate_account("engine", "", Role.ROLE_USER, ("g1", "*"), ("inst-",))
    with pytest.raises(InvalidArgumentError, match=r"field 'instance_groups\[1\]'"):
        validate_account("engine", "", Role.ROLE_USER, ("g1", "g}"), ())
    with pytest.raises(InvalidArgumentError, match=r"field 'instance_id_prefixes\[0\]'"):
        validate_account("engine", "", Role.ROLE_USER, (), ("a b",))


@pytest.mark.parametrize("instance_id", ["victim}:s:x", "{victim}", "a b", "a\tb", "x" * 129, "a\u00a0b", "a\x85"])
def test_instance_ids_outside_the_key_alphabet_are_refused(instance_id):
    with pytest.raises(InvalidArgumentError, match="field 'instance_id'"):
        validate_register_request(request(instance_id=instance_id))
    with pytest.raises(InvalidArgumentError, match="field 'instance_id'"):
        validate_key_fields(GetCacheLocationRequest(instance_id=instance_id))


@pytest.mark.parametrize(
    "instance_id",
    ["instance_1", "inst-a", "3780643326877293460", "Qwen/Qwen3-8B@10.0.0.1:8000", "x" * 128, 'in%st"ance_é'],
)
def test_upstream_style_instance_ids_are_accepted(instance_id):
    validate_register_request(request(instance_id=instance_id))
    validate_key_fields(GetCacheLocationRequest(instance_id=instance_id))


def test_group_names_in_requests_follow_the_key_rule():
    from chalicelib.protocol.models import GetInstanceGroupUsageRequest, RemoveInstanceRequest

    with pytest.raises(InvalidArgumentError, match="field 'instance_group'"):
        validate_key_fields(RemoveInstanceRequest(instance_id="i1", instance_group="g}x"))
    with pytest.raises(InvalidArgumentError, match="field 'instance_group_name'"):
        validate_key_fields(GetInstanceGroupUsageRequest(instance_group_name="g}x"))
    validate_key_fields(GetInstanceGroupUsageRequest(instance_group_name="g1"))


@pytest.mark.parametrize("session_id", ["x}", "A" * 32, "a" * 31, "a" * 33, "../" + "a" * 29])
def test_finish_takes_only_server_made_session_ids(session_id):
    with pytest.raises(InvalidArgumentError, match="field 'write_session_id'"):
        validate_key_fields(FinishWriteCacheRequest(instance_id="i1", write_session_id=session_id))
    validate_key_fields(FinishWriteCacheRequest(instance_id="i1", write_session_id="0a" * 16))
