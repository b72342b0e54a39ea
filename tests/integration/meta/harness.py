"""Helpers of the meta API tests (fixtures are in this directory's conftest)."""

from __future__ import annotations

from tests.helpers import SPECS


def code(resp: dict) -> str:
    return resp["header"]["status"]["code"]


def register(http, group: str = "g1", instance: str = "i1") -> str:
    """registerInstance with the tests' specs (block size 4); fails the test unless OK."""
    resp = http(
        "registerInstance",
        {
            "instance_group": group,
            "instance_id": instance,
            "block_size": 4,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert code(resp) == "OK", resp
    return instance


def write(http, keys, instance="i1", success=None, **extra):
    """start + finish; returns the start response."""
    start = http("startWriteCache", {"instance_id": instance, "block_keys": keys, **extra})
    assert code(start) == "OK", start
    n = len(start["locations"])
    mask = {"bool_masks": {"values": success}} if success is not None else {"offset": n}
    fin = http(
        "finishWriteCache",
        {"instance_id": instance, "write_session_id": start["write_session_id"], "success_blocks": mask},
    )
    assert code(fin) == "OK", fin
    return start


# ---------------------------------------------------------------- event reports

HOST, HOST2 = "10.0.0.8:8080", "10.0.0.9:8080"
L1, L2 = "ST_EVENT_REPORT_L1P5", "ST_EVENT_REPORT_L2"
#: A hybrid model's specs (full and linear attention), as the event-report engines register.
ER_SPECS = [{"name": "full_0", "size": 1024}, {"name": "linear_0", "size": 256}]
LIVENESS = {
    "heartbeat_timeout_ms": 1000,
    "cleanup_grace_ms": 2000,
    "liveness_check_interval_ms": 200,
    "snapshot_min_interval_ms": 30000,
}


def report(http, events, host=HOST, storage_type=L1, instance="e1"):
    return http(
        "reportEvent",
        {
            "trace_id": "t",
            "instance_id": instance,
            "host_ip_port": host,
            "storage_type": storage_type,
            "events": events,
        },
    )


def add(key, medium="gpu", **specs):
    specs = specs or {"full_0": f"event_report://h/gpu/{key}?size=4096"}
    return {
        "event_type": "EVENT_BLOCK_ADD",
        "block_add": {
            "block_key": str(key),
            "medium": medium,
            "specs": [{"name": n, "uri": u} for n, u in specs.items()],
        },
    }


def delete(key, medium="gpu", names=("full_0",)):
    return {
        "event_type": "EVENT_BLOCK_DELETE",
        "block_delete": {"block_key": str(key), "medium": medium, "spec_names": list(names)},
    }


def snapshot(*blocks):
    return {
        "event_type": "EVENT_BLOCK_SNAPSHOT",
        "block_snapshot": {
            "blocks": [
                {"block_key": str(k), "medium": "gpu", "specs": [{"name": "full_0", "uri": f"event_report://h/{k}"}]}
                for k in blocks
            ]
        },
    }


REGISTER = {"event_type": "EVENT_NODE_REGISTER", "node_register": {"mediums": ["gpu", "mem"]}}
HEARTBEAT = {"event_type": "EVENT_HEARTBEAT", "heartbeat": {"system_status": {"load": "0.4"}}}
HOST_DOWN = {"event_type": "EVENT_HOST_DOWN", "host_down": {}}


def hosts(http, keys, instance="e1", **extra):
    resp = http(
        "getHostCacheState",
        {"instance_id": instance, "query_type": "QT_PREFIX_MATCH", "block_cache_keys": keys, **extra},
    )
    assert code(resp) == "OK", resp
    return {h["host_ip_port"]: int(h["local"]) for h in resp["hosts"]}


def reported_state(valkey) -> dict:
    """Every event-report key and its content (what a refused request must leave alone)."""
    return {key: valkey.dump(key) for key in sorted(valkey.keys("*:er*"))}
