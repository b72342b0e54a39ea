"""registerInstance, storage config and account validation."""
import pytest

from chalicelib.control.validation import (validate_credentials, validate_register_request,
                                           validate_storage_config)
from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.protocol.models import RegisterInstanceRequest, StorageConfig


def request(**overrides) -> RegisterInstanceRequest:
    data = {"instance_group": "g", "instance_id": "i", "block_size": 16,
            "location_spec_infos": [{"name": "tp0", "size": 10}, {"name": "tp1", "size": 10}],
            "model_deployment": {"model_name": "m", "dtype": "bf16"},
            "location_spec_groups": [{"name": "all", "spec_names": ["tp0", "tp1"]}]}
    data.update(overrides)
    return RegisterInstanceRequest.model_validate(data)


def test_a_complete_request_is_valid():
    validate_register_request(request())


@pytest.mark.parametrize("overrides, path", [
    ({"instance_group": ""}, "instance_group"),
    ({"instance_id": ""}, "instance_id"),
    ({"instance_id": "a\nb"}, "instance_id"),
    ({"instance_id": "x" * 257}, "instance_id"),
    ({"block_size": 0}, "block_size"),
    ({"block_size": -4}, "block_size"),
    ({"location_spec_infos": []}, "location_spec_infos"),
    ({"location_spec_infos": [{"name": "", "size": 1}]}, "location_spec_infos[0].name"),
    ({"location_spec_infos": [{"name": "a", "size": 0}]}, "location_spec_infos[0].size"),
    ({"location_spec_infos": [{"name": "a", "size": 1}, {"name": "a", "size": 1}], "location_spec_groups": []},
     "location_spec_infos[1]"),
    ({"model_deployment": None}, "model_deployment"),
    ({"model_deployment": {"dtype": "bf16"}}, "model_deployment.model_name"),
    ({"model_deployment": {"model_name": "m"}}, "model_deployment.dtype"),
    ({"model_deployment": {"model_name": "m", "dtype": "x", "tp_size": -1}}, "model_deployment.tp_size"),
    ({"location_spec_groups": [{"name": "", "spec_names": ["tp0"]}]}, "location_spec_groups[0].name"),
    ({"location_spec_groups": [{"name": "g", "spec_names": []}]}, "location_spec_groups[0].spec_names"),
    ({"location_spec_groups": [{"name": "g", "spec_names": ["tp0", "tp9"]}]},
     "location_spec_groups[0].spec_names[1]"),
    ({"location_spec_groups": [{"name": "g", "spec_names": ["tp0", "tp0"]}]},
     "location_spec_groups[0].spec_names[1]"),
    ({"location_spec_groups": [{"name": "g", "spec_names": ["tp0"]}, {"name": "g", "spec_names": ["tp1"]}]},
     "location_spec_groups[1]"),
])
def test_register_rules_name_the_field(overrides, path):
    with pytest.raises(InvalidArgumentError) as err:
        validate_register_request(request(**overrides))
    assert f"field '{path}'" in str(err.value)


@pytest.mark.parametrize("config, message", [
    (None, "field 'storage' is required"),
    ({"nfs": {"root_path": "/x"}}, "field 'storage.global_unique_name' is required"),
    ({"global_unique_name": "a"}, "field 'storage' must set one of nfs, threefs"),
])
def test_storage_config_generic_checks(config, message):
    model = None if config is None else StorageConfig.model_validate(config)
    with pytest.raises(InvalidArgumentError, match=message):
        validate_storage_config(model)


@pytest.mark.parametrize("user, password, path", [
    ("", "pw", "user_name"), ("a:b", "pw", "user_name"), ("alice", "", "password"),
    ("alice", "p" * 1025, "password"),
])
def test_credentials(user, password, path):
    with pytest.raises(InvalidArgumentError, match=f"field '{path}'"):
        validate_credentials(user, password)
