"""SnapStart: a container restored from a snapshot drops the snapshot's connections and
identity through the restore hook, connects again and answers."""

import random

import snapshot_restore_py

from chalicelib import runtime as runtime_module
from tests.integration.meta.harness import code, write


def run_restore_hooks() -> None:
    """What Lambda does after restoring a snapshot: every registered hook, in order."""
    for func, args, kwargs in snapshot_restore_py.get_after_restore():
        func(*args, **kwargs)


def test_the_runtime_registers_its_restore_hook():
    assert runtime_module.after_restore in [func for func, _, _ in snapshot_restore_py.get_after_restore()]


def test_a_restored_container_reconnects_and_answers(runtime, http, instance, monkeypatch):
    monkeypatch.delenv("KVCM_NODE_ID", raising=False)
    write(http, [11, 12, 13])
    valkey, dynamodb, cache, node_id = runtime.valkey, runtime.aws("dynamodb"), runtime.cache, runtime.settings.node_id

    run_restore_hooks()

    resp = http(
        "getCacheLocation", {"instance_id": instance, "query_type": "QT_PREFIX_MATCH", "block_keys": [11, 12, 13]}
    )
    assert code(resp) == "OK" and len(resp["locations"]) == 3, resp
    assert runtime.valkey is not valkey and runtime.aws("dynamodb") is not dynamodb and runtime.cache is not cache
    assert runtime.settings.node_id != node_id


def test_a_node_id_from_the_environment_survives_the_restore(runtime, monkeypatch):
    monkeypatch.setenv("KVCM_NODE_ID", runtime.settings.node_id)
    node_id = runtime.settings.node_id
    run_restore_hooks()
    assert runtime.settings.node_id == node_id
    assert runtime.valkey.ping()


def test_the_hook_without_a_runtime_builds_none_and_draws_a_new_random_sequence():
    runtime_module.set_runtime(None)
    random.seed(7)  # what every container restored from one snapshot would continue from
    snapshot = random.getstate()
    run_restore_hooks()
    assert runtime_module._runtime is None
    assert random.getstate() != snapshot
