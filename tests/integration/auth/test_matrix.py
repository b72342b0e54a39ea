"""Every method × every role × in scope / out of scope, over HTTP with API keys (issue 11.2).

An account scoped to instance group g1 and instance ids ``in-`` must never reach g2, its
instances or the service-wide methods; within its scope it gets exactly what its role
allows. "Allowed" means the call got past authorization (any answer but 401/403: a
second removal of the same instance may well say INSTANCE_NOT_EXIST).
"""

import pytest

from chalicelib.auth.policy import ROLE_ACTIONS
from chalicelib.protocol.codes import Role
from chalicelib.protocol.models import StorageConfig
from chalicelib.routes import admin, debug, meta
from tests.helpers import SPECS
from tests.integration.control.harness import code, enable_auth, group, group_json, nfs, post, register_request

OPERATIONS = {op.api_name: op for op in meta.OPERATIONS + admin.OPERATIONS + debug.OPERATIONS}
ROLES = [Role.ROLE_ADMIN, Role.ROLE_OPERATOR, Role.ROLE_ENGINE, Role.ROLE_READ_ONLY]


def _instance(instance_id: str, **extra) -> dict:
    return {"instance_id": instance_id, **extra}


def _register(group_name: str, instance_id: str) -> dict:
    return {
        "instance_group": group_name,
        "instance_id": instance_id,
        "block_size": 16,
        "location_spec_infos": SPECS[:1],
        "model_deployment": {"model_name": "m", "dtype": "bf16"},
    }


# method -> (body in scope, [bodies out of scope]); None = a service-wide method (in scope
# only for an account scoped to every group).
SCOPED = {
    "registerInstance": (_register("g1", "in-new"), [_register("g2", "in-new2"), _register("g1", "x-new")]),
    "getInstanceInfo": (_instance("in-1"), [_instance("out-1")]),
    "getCacheLocation": (_instance("in-1", block_keys=[1]), [_instance("out-1", block_keys=[1])]),
    "getCacheMeta": (_instance("in-1", block_keys=[1]), [_instance("out-1", block_keys=[1])]),
    "getCacheMetaDetail": (_instance("in-1", block_keys=[1]), [_instance("out-1", block_keys=[1])]),
    "startWriteCache": (_instance("in-1", block_keys=[1]), [_instance("out-1", block_keys=[1])]),
    "finishWriteCache": (
        _instance("in-1", write_session_id="a" * 32, success_blocks={"offset": 0}),
        [_instance("out-1", write_session_id="a" * 32, success_blocks={"offset": 0})],
    ),
    "removeCache": (_instance("in-1", block_keys=[1]), [_instance("out-1", block_keys=[1])]),
    "trimCache": (
        _instance("in-1", strategy="TS_REMOVE_ALL_CACHE"),
        [_instance("out-1", strategy="TS_REMOVE_ALL_CACHE")],
    ),
    "getCacheLocationLen": (
        _instance("in-1", block_keys=[1], query_type="QT_BATCH_GET"),
        [_instance("out-1", block_keys=[1], query_type="QT_BATCH_GET")],
    ),
    "getClusterInfo": (_instance("in-1"), [_instance("out-1")]),
    "reportEvent": (
        _instance("in-1", host_ip_port="h:1", events=[]),
        [_instance("out-1", host_ip_port="h:1", events=[])],
    ),
    "getHostCacheState": (
        _instance("in-1", block_cache_keys=[1], query_type="QT_PREFIX_MATCH"),
        [_instance("out-1", block_cache_keys=[1], query_type="QT_PREFIX_MATCH")],
    ),
    "getCacheLocationsByBackend": (
        _instance(
            "in-1",
            block_keys=[1],
            query_type="QT_BATCH_GET",
            backend_selectors=[{"backend_type": "ST_NFS", "strategy": "LSS_WEIGHTED_RANDOM"}],
        ),
        [
            _instance(
                "out-1",
                block_keys=[1],
                query_type="QT_BATCH_GET",
                backend_selectors=[{"backend_type": "ST_NFS", "strategy": "LSS_WEIGHTED_RANDOM"}],
            )
        ],
    ),
    "createInstanceGroup": (
        {"instance_group": group_json("g1", "nfs1")},
        [{"instance_group": group_json("g3", "nfs1")}],
    ),
    "updateInstanceGroup": (
        {"instance_group": group_json("g1", "nfs1"), "current_version": 1},
        [{"instance_group": group_json("g2", "nfs1"), "current_version": 1}],
    ),
    "removeInstanceGroup": ({"name": "g1"}, [{"name": "g2"}]),
    "getInstanceGroup": ({"name": "g1"}, [{"name": "g2"}]),
    "getGroupHitCurve": ({"name": "g1"}, [{"name": "g2"}]),
    "resetGroupHitCurve": ({"name": "g1"}, [{"name": "g2"}]),
    "listInstanceInfo": ({"instance_group_name": "g1"}, [{"instance_group_name": "g2"}, {}]),
    "getInstanceGroupUsage": ({"instance_group_name": "g1"}, [{"instance_group_name": "g2"}, {}]),
    "removeInstance": ({"instance_id": "in-1"}, [{"instance_id": "out-1"}]),
    "migrateCache": ({"instance_id": "in-1"}, [{"instance_id": "out-1"}]),
    "listAsyncCopyQuarantine": ({"instance_group_name": "g1"}, [{"instance_group_name": "g2"}, {}]),
}
SERVICE_BODIES = {
    "addStorage": {"storage": nfs("nfs9")},
    "enableStorage": {"storage_unique_name": "nfs1"},
    "disableStorage": {"storage_unique_name": "nfs1"},
    "removeStorage": {"storage_unique_name": "nfs9"},
    "updateStorage": {"storage": nfs("nfs1")},
    "addAccount": {"user_name": "new-engine"},
    "deleteAccount": {"user_name": "nobody"},
    "createApiKey": {"user_name": "new-engine"},
    "revokeApiKey": {"key_id": "0123456789abcdef"},
    "updateLogger": {"log_level": "INFO"},
    "injectFault": {"api_name": "getCacheLocation"},
    "removeFault": {"api_name": "getCacheLocation"},
}


def test_every_method_is_in_the_matrix():
    service = set(OPERATIONS) - set(SCOPED)
    assert all(OPERATIONS[name].target.__name__ == "service" for name in service)
    assert all(OPERATIONS[name].target.__name__ != "service" for name in SCOPED if name != "listInstanceGroup")


@pytest.fixture
def keys(runtime, client):
    """An API key per role, scoped to every group ("<role>-all") and to g1 + ``in-`` ("<role>-g1")."""
    control = runtime.control
    control.add_storage(StorageConfig.model_validate(nfs("nfs1", "/tmp/kvcm-matrix")))
    control.create_group(group("g1", "nfs1"))
    control.create_group(group("g2", "nfs1"))
    control.register_instance(register_request("in-1", "g1"))
    control.register_instance(register_request("out-1", "g2"))
    made = {}
    for role in ROLES:
        for scope, groups, prefixes in (("all", [], []), ("g1", ["g1"], ["in-"])):
            name = f"{role.name.lower()}-{scope}"
            control.add_account(name, "matrix-pass-12" if role == Role.ROLE_ADMIN else "", role, groups, prefixes)
            made[(role, scope)] = {"Authorization": f"Bearer {control.create_api_key(name, 3600)[0]}"}
    enable_auth(runtime)
    return made


def allowed(status: int, data: dict) -> bool:
    return status not in (401, 403) and code(data) not in ("UNAUTHENTICATED", "PERMISSION_DENIED")


@pytest.mark.slow  # every method x role x scope on a fresh control plane: about 25 s in all
@pytest.mark.parametrize("method", sorted(OPERATIONS))
def test_role_and_scope_matrix(client, keys, method):
    op = OPERATIONS[method]
    if method in SCOPED:
        in_body, out_bodies = SCOPED[method]
        cases = [(keys[(role, "g1")], body, False, role) for role in ROLES for body in out_bodies]
        cases += [(keys[(role, "g1")], in_body, True, role) for role in ROLES]
    else:
        body = SERVICE_BODIES.get(method, {})
        cases = [(keys[(role, "g1")], body, False, role) for role in ROLES]
        cases += [(keys[(role, "all")], body, True, role) for role in ROLES]
    for headers, body, in_scope, role in cases:  # refusals first: they must change nothing
        status, data = post(client, method, body, headers=headers)
        expected = in_scope and op.action in ROLE_ACTIONS[role]
        assert allowed(status, data) == expected, (role.name, in_scope, body, status, data)
        if not expected:
            assert (status, code(data)) == (403, "PERMISSION_DENIED"), (role.name, body, data)
    assert post(client, method, {}, headers={})[0] == 401
