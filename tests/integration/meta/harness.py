"""Helpers of the meta API tests (fixtures are in this directory's conftest)."""

from __future__ import annotations

SPECS = [{"name": "tp0", "size": 1024}, {"name": "tp1", "size": 1024}]


def code(resp: dict) -> str:
    return resp["header"]["status"]["code"]


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
