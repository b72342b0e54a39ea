"""An instance's key space costs what it holds and belongs to one registration:
removal of a sparse instance in a huge group, metadata-only trims that keep the data
charged, re-registration over blocks a lost registration left, foreign finishes."""

from pathlib import Path

import pytest

from chalicelib.index.types import FIRST_BUCKET_BITS, MODE_RAW
from chalicelib.protocol.models import InstanceGroup

from .harness import SPECS, code, write

GIB = 1 << 30


def _register(http, instance_id="big", group="huge", block_size=4, specs=None):
    return http(
        "registerInstance",
        {
            "instance_group": group,
            "instance_id": instance_id,
            "block_size": block_size,
            "location_spec_infos": specs or [{"name": "tp0", "size": 1024}],
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )


def _server_commands(valkey) -> int:
    stats = valkey.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config|resetstat"))


def _data_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_removing_a_sparse_instance_of_a_100_gib_group_costs_its_blocks(http, runtime, group, nfs_root, valkey):
    """1 KiB blocks in a 100 GiB group: the instance may hold 2^26 blocks, yet starts with
    16 buckets (they grow with its blocks, not with the quota: issue 23 item 10). Removing
    it reads what it holds, not the buckets it could hold (which took minutes)."""
    runtime.control.create_group(
        InstanceGroup.model_validate(
            {"name": "huge", "storage_candidates": ["nfs_01"], "quota": {"capacity": 100 * GIB}}
        )
    )
    assert code(_register(http)) == "OK"
    layout = runtime.contexts("big").layout
    assert runtime.index.bucket_count(layout) == 1 << FIRST_BUCKET_BITS == 16
    for start in write(http, [11, 12, 13], instance="big")["locations"]:
        for spec in start["location_specs"]:
            path = Path(spec["uri"].split("?")[0][len("file://nfs_01") :])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 4096)
    assert _data_files(nfs_root)

    valkey.config_resetstat()
    assert code(http("removeInstance", {"instance_id": "big"})) == "OK"
    commands = _server_commands(valkey)

    assert commands < 200, f"{commands} Valkey commands to remove 3 blocks"
    assert code(http("getInstanceInfo", {"instance_id": "big"})) == "INSTANCE_NOT_EXIST"
    assert runtime.control.get_instance("big") is None
    assert _data_files(nfs_root) == []
    assert valkey.exists(layout.key("u"), layout.occupied, layout.bucket(11), layout.bucket(12)) == 0
    assert runtime.index.group_usage(["huge"])[0].bytes == 0
    assert code(_register(http)) == "OK"  # the id is free again, with an empty key space
    assert runtime.index.read_raw(runtime.contexts("big").layout, [11], MODE_RAW) == [None]


def test_trimming_all_metadata_keeps_the_data_charged(http, runtime, group, instance):
    """TS_REMOVE_ALL_META leaves the data on storage: its bytes stay counted, so a trim
    cannot be used to store past the quota (the old code zeroed the usage)."""
    runtime.control.update_group(
        InstanceGroup.model_validate(
            {
                **group.model_dump(),
                "version": 0,
                "quota": {"capacity": 8 * 2048},
                "cache_config": {"reclaim_strategy": {"trigger_strategy": {"used_percentage": 3.2}}},
            }
        ),
        current_version=group.version,
    )
    write(http, [1, 2, 3, 4])
    assert code(http("trimCache", {"instance_id": "i1", "strategy": "TS_REMOVE_ALL_META"})) == "OK"
    ctx = runtime.contexts("i1")
    usage = runtime.index.usage([ctx.layout])[0]
    assert (usage.bytes, usage.keys) == (4 * 2048, 0)
    assert runtime.index.read_raw(ctx.layout, [1, 2, 3, 4], MODE_RAW) == [None] * 4
    write(http, [5, 6, 7, 8])
    refused = http("startWriteCache", {"instance_id": "i1", "block_keys": [9]})
    assert code(refused) == "REACH_MAX_ENTITY_CAPACITY", refused
    assert code(http("removeInstance", {"instance_id": "i1"})) == "OK"
    assert runtime.index.group_usage(["g1"])[0].bytes == 0  # released with the instance


def _fill(start: dict) -> None:
    """Write the data files a start's locations name (what an engine would write)."""
    for location in start["locations"]:
        for spec in location["location_specs"]:
            path = Path(spec["uri"].split("?")[0][len("file://nfs_01") :])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 4096)


def test_data_forgotten_by_metadata_trims_is_deleted_with_the_instance(http, runtime, group, instance, nfs_root):
    """Issue #28 item 6: TS_REMOVE_ALL_META forgets records and keeps their bytes charged;
    removeInstance then deletes the forgotten data before it releases the charge (the old
    purge released it and left the files: 27 MiB on disk under an 8 MiB quota)."""
    for cycle in range(3):
        keys = [10 * cycle + k for k in (1, 2, 3, 4, 5)]
        _fill(write(http, keys))
        assert code(http("trimCache", {"instance_id": "i1", "strategy": "TS_REMOVE_ALL_META"})) == "OK"
    _fill(write(http, [100, 101]))  # and blocks still indexed
    layout = runtime.contexts("i1").layout
    assert runtime.index.usage([layout])[0].bytes == 17 * 2048  # forgotten bytes stay charged meanwhile
    assert _data_files(nfs_root)

    assert code(http("removeInstance", {"instance_id": "i1"})) == "OK"

    assert _data_files(nfs_root) == []
    assert runtime.index.group_usage(["g1"])[0].bytes == 0
    assert runtime.valkey.scard(layout.key("fg")) == 0


def test_forgotten_data_stays_charged_until_its_deletion_succeeds(
    http, runtime, group, instance, nfs_root, monkeypatch
):
    """A removal whose storage refuses to delete keeps the forgotten bytes charged and
    listed; the watchdog's resumed purge deletes them and only then releases them."""
    from chalicelib.storage.file import FileBackend

    _fill(write(http, [1, 2, 3, 4, 5]))
    assert code(http("trimCache", {"instance_id": "i1", "strategy": "TS_REMOVE_ALL_META"})) == "OK"
    layout = runtime.contexts("i1").layout

    def refuse(*args, **kwargs):
        raise OSError("storage unavailable")

    monkeypatch.setattr(FileBackend, "delete_groups", refuse)
    assert code(http("removeInstance", {"instance_id": "i1"})) != "OK"
    assert runtime.index.group_usage(["g1"])[0].bytes == 5 * 2048
    assert runtime.valkey.scard(layout.key("fg")) == 5
    assert _data_files(nfs_root)

    monkeypatch.undo()
    assert runtime.purge.resume_removals() == ["i1"]
    assert _data_files(nfs_root) == []
    assert runtime.index.group_usage(["g1"])[0].bytes == 0
    assert runtime.valkey.scard(layout.key("fg")) == 0
    assert runtime.control.get_instance("i1") is None


def test_a_registration_lost_from_the_control_plane_never_serves_its_blocks_again(http, runtime, group, instance):
    """The id registered again (here for another model) gets an empty key space: the
    previous registration's blocks are dropped, not served as the new model's."""
    write(http, [1, 2, 3])
    old = runtime.contexts("i1").layout
    from chalicelib.control.table import delete

    runtime.control.table.write([delete("INSTANCE", "i1")])  # the record is lost; Valkey keeps the blocks
    runtime.config.invalidate()
    runtime.contexts.forget("i1")
    resp = http(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": "i1",
            "block_size": 8,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "other-model", "dtype": "fp16"},
        },
    )
    assert code(resp) == "OK", resp
    hits = http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2, 3]})
    assert code(hits) == "OK" and hits["locations"] == []
    assert runtime.index.usage([old])[0].keys == 0


def test_a_container_holding_a_previous_registration_cannot_write(http, runtime, group, instance):
    """Between a re-registration and a container's config refresh, its writes carry the
    previous incarnation and are refused by the index."""
    import dataclasses

    from chalicelib.index.errors import InstanceGoneError
    from chalicelib.index.types import StartRequest

    layout = runtime.contexts("i1").layout
    stale = dataclasses.replace(layout, incarnation="an-earlier-registration")
    with pytest.raises(InstanceGoneError):
        runtime.index.start(
            stale,
            [1],
            StartRequest(
                session_id="s" * 32,
                deadline_ms=10**13,
                storage_name="nfs_01",
                storage_type="ST_NFS",
                pack_count=0,
                sizes=[2048],
                spec_groups=[0],
            ),
        )


def test_a_session_is_finished_only_by_its_own_instance(http, runtime, group, instance, valkey):
    start = http("startWriteCache", {"instance_id": "i1", "block_keys": [1]})
    layout = runtime.contexts("i1").layout
    valkey.hset(layout.session(start["write_session_id"]), "i", "another-instance")
    fin = http(
        "finishWriteCache",
        {"instance_id": "i1", "write_session_id": start["write_session_id"], "success_blocks": {"offset": 1}},
    )
    assert code(fin) == "INVALID_ARGUMENT" and "unknown" in fin["header"]["status"]["message"]


def test_open_write_sessions_are_capped_per_instance(http, runtime, group, instance):
    """A start that writes keys opens a session, capped per instance; a start with no new
    key opens none (4,096 such starts locked the owner's writes out for an hour: issue
    #28 item 8), and its session id finishes with nothing to close."""
    runtime.reconfigure(max_write_sessions=3)
    write(http, [1])
    empty = [http("startWriteCache", {"instance_id": "i1", "block_keys": [1]}) for _ in range(5)]
    assert [code(r) for r in empty] == ["OK"] * 5 and all(r["locations"] == [] for r in empty)
    opened = [http("startWriteCache", {"instance_id": "i1", "block_keys": [k]}) for k in (2, 3, 4)]
    assert [code(r) for r in opened] == ["OK", "OK", "OK"]
    refused = http("startWriteCache", {"instance_id": "i1", "block_keys": [5]})
    assert (
        code(refused) == "REACH_MAX_ENTITY_CAPACITY"
        and "KVCM_MAX_WRITE_SESSIONS" in refused["header"]["status"]["message"]
    )
    assert json_statuses(http, [5]) == ["CLS_NOT_FOUND"]
    fin = http(
        "finishWriteCache",
        {"instance_id": "i1", "write_session_id": empty[0]["write_session_id"], "success_blocks": {"offset": 0}},
    )
    assert code(fin) == "OK", fin
    http(
        "finishWriteCache",
        {"instance_id": "i1", "write_session_id": opened[0]["write_session_id"], "success_blocks": {"offset": 1}},
    )
    assert code(http("startWriteCache", {"instance_id": "i1", "block_keys": [5]})) == "OK"


def test_a_start_whose_response_could_not_fit_is_refused_before_it_grants(http, runtime, group):
    """8 specs x 6,000 keys would be a 6.4 MB response: Lambda would drop it after the
    grant. It is refused first, naming how many keys fit, and nothing is WRITING."""
    specs = [{"name": f"tp{i}", "size": 1024} for i in range(8)]
    resp = http(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": "wide",
            "block_size": 4,
            "location_spec_infos": specs,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert code(resp) == "OK", resp
    refused = http("startWriteCache", {"instance_id": "wide", "block_keys": list(range(1, 6001))})
    message = refused["header"]["status"]["message"]
    assert code(refused) == "INVALID_ARGUMENT" and "block_keys" in message and "at most" in message
    fit = int(message.split("at most ")[1].split()[0])
    assert runtime.index.usage([runtime.contexts("wide").layout])[0].keys == 0
    granted = http("startWriteCache", {"instance_id": "wide", "block_keys": list(range(1, fit + 1))})
    assert code(granted) == "OK" and len(json_dumps(granted)) < 6_000_000


@pytest.mark.parametrize(
    "field, value, limit",
    [
        ("location_spec_infos", [{"name": f"s{i}", "size": 1} for i in range(2000)], "limit of 64"),
        ("model_deployment", {"model_name": "m", "dtype": "f", "user_data": "x" * 500_000}, "limit of 65536"),
    ],
)
def test_configs_no_call_could_use_are_refused_at_registration(http, group, field, value, limit):
    body = {
        "instance_group": "g1",
        "instance_id": "odd",
        "block_size": 4,
        "location_spec_infos": SPECS,
        "model_deployment": {"model_name": "m", "dtype": "fp16"},
        field: value,
    }
    resp = http("registerInstance", body)
    assert code(resp) == "INVALID_ARGUMENT" and field in resp["header"]["status"]["message"], resp
    assert limit in resp["header"]["status"]["message"]
    assert code(http("getInstanceInfo", {"instance_id": "odd"})) == "INSTANCE_NOT_EXIST"


def json_statuses(http, keys):
    import json

    return [json.loads(m)["status"] for m in http("getCacheMeta", {"instance_id": "i1", "block_keys": keys})["metas"]]


def json_dumps(body) -> str:
    import json

    return json.dumps(body, separators=(",", ":"))
