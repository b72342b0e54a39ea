"""Names that enter Valkey keys are checked before any key is built (issue 11.1): an
instance id with a '}' would end the cluster hash tag early and put its keys into another
instance's key space (same slot, keys beside the victim's)."""

from __future__ import annotations

import pytest
from redis.cluster import key_slot

from chalicelib.index.types import InstanceLayout
from tests.integration.meta.harness import SPECS, code, write

ESCAPE = "victim}:s:x"


def test_the_escape_is_real_a_brace_shares_the_victims_slot():
    victim, attacker = InstanceLayout("kvcm", "victim", 4), InstanceLayout("kvcm", ESCAPE, 4)
    assert key_slot(attacker.session("a" * 32)) == key_slot(victim.session("a" * 32))


@pytest.mark.parametrize("instance_id", [ESCAPE, "{victim}", "two words", "tab\tbed", "x" * 129])
def test_registration_refuses_ids_outside_the_key_rule(http, group, runtime, instance_id):
    resp = http(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": instance_id,
            "block_size": 4,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert code(resp) == "INVALID_ARGUMENT" and "field 'instance_id'" in resp["header"]["status"]["message"]
    assert runtime.control.list_instances() == []


@pytest.mark.parametrize(
    "method, body",
    [
        ("getCacheLocation", {"block_keys": [1]}),
        ("getCacheMeta", {"block_keys": [1]}),
        ("startWriteCache", {"block_keys": [1]}),
        ("removeCache", {"block_keys": [1]}),
        ("trimCache", {"strategy": "TS_REMOVE_ALL_CACHE"}),
        ("getInstanceInfo", {}),
        ("finishWriteCache", {"write_session_id": "a" * 32, "success_blocks": {"offset": 0}}),
    ],
)
def test_a_bad_id_on_any_call_never_reaches_valkey(http, instance, runtime, monkeypatch, method, body):
    def no_valkey(*args, **kwargs):
        raise AssertionError("Valkey was called")

    monkeypatch.setattr(type(runtime.valkey), "execute_command", no_valkey)
    resp = http(method, {"instance_id": ESCAPE, **body})
    assert code(resp) == "INVALID_ARGUMENT" and "field 'instance_id'" in resp["header"]["status"]["message"]


@pytest.mark.parametrize("session_id", ["x}", "A" * 32, "a" * 31, "../" + "a" * 29, "a" * 32 + "}:s:b"])
def test_finish_takes_only_server_made_session_ids(http, instance, session_id):
    write(http, [1, 2])
    resp = http(
        "finishWriteCache", {"instance_id": instance, "write_session_id": session_id, "success_blocks": {"offset": 0}}
    )
    assert code(resp) == "INVALID_ARGUMENT" and "field 'write_session_id'" in resp["header"]["status"]["message"]


def test_storage_and_group_names_follow_the_key_rule(http, runtime, tmp_path):
    from chalicelib.control.groups import normalize_group
    from chalicelib.protocol.errors import InvalidArgumentError
    from chalicelib.protocol.models import InstanceGroup, StorageConfig
    from chalicelib.protocol.validation import validate_storage_config

    with pytest.raises(InvalidArgumentError, match="field 'storage.global_unique_name'"):
        validate_storage_config(StorageConfig.model_validate({"global_unique_name": "mp}", "nfs": {"root_path": "/x"}}))
    with pytest.raises(InvalidArgumentError, match=r"field 'instance_group.name'"):
        normalize_group(InstanceGroup.model_validate({"name": "g 1", "storage_candidates": ["a"]}))
