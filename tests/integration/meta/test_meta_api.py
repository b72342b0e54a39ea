"""MetaService semantics of API.md over HTTP, against real Valkey and moto."""

import json
from pathlib import Path

from chalicelib.protocol.models import InstanceGroup, StorageConfig
from chalicelib.storage.base import BlockRef

from .harness import SPECS, code, register, write


def prefix(http, keys, **extra):
    return http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "block_keys": keys, **extra})


def test_register_is_idempotent_and_returns_storages(http, instance):
    body = {
        "instance_group": "g1",
        "instance_id": "i1",
        "block_size": 4,
        "location_spec_infos": SPECS,
        "model_deployment": {"model_name": "m", "dtype": "fp16", "user_data": "other"},
    }
    resp = http("registerInstance", body)
    assert code(resp) == "OK"
    storages = json.loads(resp["storage_configs"])
    assert storages[0]["global_unique_name"] == "nfs_01" and storages[0]["type"] == "file"
    body["model_deployment"]["model_name"] = "other-model"
    assert code(http("registerInstance", body)) == "DUPLICATE_ENTITY"
    info = http("getInstanceInfo", {"instance_id": "i1"})
    assert info["instance_group"] == "g1" and info["instance_info"]["block_size"] == 4


def test_unknown_instance(http, group):
    for method in ("getCacheLocation", "startWriteCache", "getCacheMeta", "removeCache", "getInstanceInfo"):
        resp = http(method, {"instance_id": "nope", "query_type": "QT_BATCH_GET", "block_keys": [1]})
        assert code(resp) == "INSTANCE_NOT_EXIST", (method, resp)


def test_prefix_match_examples(http, instance):
    write(http, [1, 2, 3])
    assert len(prefix(http, [1, 2, 3])["locations"]) == 3
    assert len(prefix(http, [1, 2, 4, 3])["locations"]) == 2
    assert prefix(http, [1, 2, 3], block_mask={"offset": 3})["locations"] == []
    masked = prefix(http, [1, 2, 3], block_mask={"bool_masks": {"values": [True, False, False]}})
    assert len(masked["locations"]) == 2
    loc = prefix(http, [1])["locations"][0]
    assert loc["type"] == "ST_NFS" and loc["spec_size"] == 2
    assert [s["name"] for s in loc["location_specs"]] == ["tp0", "tp1"]
    assert all(s["uri"].startswith("file://nfs_01/") and "size=1024" in s["uri"] for s in loc["location_specs"])
    filtered = prefix(http, [1], location_spec_names=["tp1"])["locations"][0]
    assert [s["name"] for s in filtered["location_specs"]] == ["tp1"] and filtered["spec_size"] == 1


def test_writing_blocks_are_not_served(http, instance):
    start = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2, 3]})
    assert prefix(http, [1, 2, 3])["locations"] == []
    meta = http("getCacheMeta", {"instance_id": "i1", "block_keys": [1, 9]})
    assert [json.loads(m)["status"] for m in meta["metas"]] == ["CLS_WRITING", "CLS_NOT_FOUND"]
    assert json.loads(meta["metas"][1])["id"] == ""
    assert len(start["write_session_id"]) == 32 and start["write_session_id"].isalnum()


def test_batch_get_pads_misses(http, instance):
    write(http, [1, 2])
    resp = http(
        "getCacheLocation",
        {"instance_id": "i1", "query_type": "QT_BATCH_GET", "block_keys": [2, 7, 1], "block_mask": {"offset": 3}},
    )
    uris = [[s["uri"] for s in loc["location_specs"]] for loc in resp["locations"]]
    assert uris[1] == ["", ""] and all(uris[0]) and all(uris[2])
    assert resp["locations"][1]["spec_size"] == 2


def test_sliding_window_examples(http, instance):
    write(http, [1, 2, 3, 4, 5, 6])
    http("removeCache", {"instance_id": "i1", "block_keys": [6]})

    def window(keys, sw):
        resp = http(
            "getCacheLocation",
            {"instance_id": "i1", "query_type": "QT_REVERSE_ROLL_SW_MATCH", "block_keys": keys, "sw_size": sw},
        )
        assert code(resp) == "OK", resp
        return [i for i, loc in enumerate(resp["locations"]) if loc["location_specs"][0]["uri"]]

    assert window([1, 2, 3, 4, 5, 6, 7], 2) == [3, 4]
    assert window([1, 2, 3, 10, 5, 6, 7], 2) == [1, 2]
    for sw in (0, 8):
        resp = http(
            "getCacheLocation",
            {"instance_id": "i1", "query_type": 3, "block_keys": [1, 2, 3, 4, 5, 6, 7], "sw_size": sw},
        )
        assert code(resp) == "INVALID_ARGUMENT" and "sw_size" in resp["header"]["status"]["message"]


def test_duplicate_writer_and_masks(http, instance):
    first = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2]})
    assert first["block_mask"] == {"offset": 0} and len(first["locations"]) == 2
    second = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2, 3]})
    assert second["block_mask"] == {"offset": 2} and len(second["locations"]) == 1
    third = http("startWriteCache", {"instance_id": "i1", "block_keys": [0, 1, 5]})
    assert third["block_mask"] == {"bool_masks": {"values": [False, True, False]}}
    assert len(third["locations"]) == 2
    none_new = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2]})
    assert none_new["locations"] == [] and none_new["write_session_id"]


def test_partial_finish_deletes_failed_blocks(http, instance, nfs_root):
    write(http, [1, 2, 3], success=[True, False, True])
    meta = http("getCacheMeta", {"instance_id": "i1", "block_keys": [1, 2, 3]})
    assert [json.loads(m)["status"] for m in meta["metas"]] == ["CLS_SERVING", "CLS_NOT_FOUND", "CLS_SERVING"]
    assert len(prefix(http, [1, 2, 3])["locations"]) == 1


def test_finish_rules(http, instance, clock):
    start = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2], "write_timeout_seconds": 5})
    sid = start["write_session_id"]
    bad_len = http(
        "finishWriteCache",
        {"instance_id": "i1", "write_session_id": sid, "success_blocks": {"bool_masks": {"values": [True]}}},
    )
    assert code(bad_len) == "INVALID_ARGUMENT" and "success_blocks" in bad_len["header"]["status"]["message"]
    too_far = http("finishWriteCache", {"instance_id": "i1", "write_session_id": sid, "success_blocks": {"offset": 3}})
    assert code(too_far) == "INVALID_ARGUMENT"
    http(
        "registerInstance",
        {
            "instance_group": "g1",
            "instance_id": "i2",
            "block_size": 4,
            "location_spec_infos": SPECS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    other = http("finishWriteCache", {"instance_id": "i2", "write_session_id": sid, "success_blocks": {"offset": 2}})
    assert code(other) == "INVALID_ARGUMENT"
    clock.advance(6)
    late = http("finishWriteCache", {"instance_id": "i1", "write_session_id": sid, "success_blocks": {"offset": 2}})
    assert code(late) == "INVALID_ARGUMENT" and "expired" in late["header"]["status"]["message"]
    assert http("getCacheMeta", {"instance_id": "i1", "block_keys": [1]})["metas"] == [
        json.dumps({"id": "", "status": "CLS_NOT_FOUND"})
    ]
    again = http("finishWriteCache", {"instance_id": "i1", "write_session_id": sid, "success_blocks": {"offset": 2}})
    assert code(again) == "INVALID_ARGUMENT"


def test_remove_cache_stops_serving_and_deletes_files(http, instance, nfs_root):
    write(http, [1, 2, 3])
    start = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2, 3, 4]})
    path = Path(start["locations"][0]["location_specs"][0]["uri"].split("?")[0][len("file://nfs_01") :])
    assert path.is_relative_to(nfs_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * 1024)  # what the engine would write
    http(
        "finishWriteCache",
        {"instance_id": "i1", "write_session_id": start["write_session_id"], "success_blocks": {"offset": 1}},
    )
    assert len(prefix(http, [1, 2, 3, 4])["locations"]) == 4
    assert code(http("removeCache", {"instance_id": "i1", "block_keys": [2, 3, 4]})) == "OK"
    assert len(prefix(http, [1, 2, 3, 4])["locations"]) == 1
    assert not path.exists()


def test_trim_strategies(http, instance, clock):
    write(http, [1, 2])
    t_mid = int(clock.now() * 1e6)
    clock.advance(10)
    write(http, [3, 4])
    resp = http(
        "trimCache",
        {"instance_id": "i1", "strategy": "TS_TIMESTAMP", "begin_timestamp": 0, "end_timestamp": str(t_mid)},
    )
    assert code(resp) == "OK"
    batch = http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_BATCH_GET", "block_keys": [1, 2, 3, 4]})
    assert [bool(loc["location_specs"][0]["uri"]) for loc in batch["locations"]] == [False, False, True, True]
    assert code(http("trimCache", {"instance_id": "i1", "strategy": "TS_REMOVE_ALL_META"})) == "OK"
    assert prefix(http, [3, 4])["locations"] == []
    write(http, [5])
    assert code(http("trimCache", {"instance_id": "i1", "strategy": 1})) == "OK"
    assert prefix(http, [5])["locations"] == []
    assert code(http("trimCache", {"instance_id": "i1"})) == "INVALID_ARGUMENT"


def test_token_ids_derive_upstream_keys(http, instance):
    write(http, [455111481605203084, 6902853672176602142])
    resp = http(
        "getCacheLocation",
        {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9]},
    )
    assert len(resp["locations"]) == 2


def test_remove_instance_deletes_its_cache(http, instance, nfs_root, runtime):
    start = write(http, [1, 2, 3])
    paths = [
        Path(s["uri"].split("?")[0][len("file://nfs_01") :])
        for loc in start["locations"]
        for s in loc["location_specs"]
    ]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    layout = runtime.contexts("i1").layout
    assert code(http("removeInstance", {"instance_id": "i1", "instance_group": "other"})) == "INVALID_ARGUMENT"
    assert len(prefix(http, [1, 2, 3])["locations"]) == 3  # a refused removal deletes nothing
    assert code(http("removeInstance", {"instance_id": "i1"})) == "OK"
    assert not any(p.exists() for p in paths)
    assert list(runtime.index.scan(layout)) == []
    assert runtime.index.usage([layout])[0].bytes == 0
    assert code(prefix(http, [1])) == "INSTANCE_NOT_EXIST"


def test_awkward_names_reach_uris_and_json_intact(http, runtime, tmp_path):
    """User strings with '%', quotes, backslashes, spaces and non-ASCII go through the
    prepared location templates: every response parses, and its URIs are the backend's own."""
    root = tmp_path / 'da"ta 100% \\ é'
    root.mkdir()
    runtime.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_~2", "nfs": {"root_path": str(root), "key_count_per_file": 2}}
        )
    )
    runtime.control.create_group(
        InstanceGroup.model_validate({"name": "g2", "storage_candidates": ["nfs_~2"], "quota": {"capacity": 1 << 30}})
    )
    instance, specs = 'in%st"ance_é', [{"name": 'tp"0%s', "size": 16}, {"name": "tp\\1%", "size": 32}]
    assert (
        code(
            http(
                "registerInstance",
                {
                    "instance_group": "g2",
                    "instance_id": instance,
                    "block_size": 4,
                    "location_spec_infos": specs,
                    "model_deployment": {"model_name": "m", "dtype": "fp16"},
                },
            )
        )
        == "OK"
    )
    start = write(http, [-1, 7, 9], instance=instance)
    backend = runtime.contexts(instance).by_name["nfs_~2"].backend
    slots = runtime.contexts(instance).spec_layout.slots(0)
    expected = [
        [backend.uri(BlockRef(instance, key, 0, group, slot, slots), spec) for spec in slots]
        for key, (group, slot) in zip([-1, 7, 9], [(1, 0), (1, 1), (3, 0)], strict=True)
    ]
    for resp in (
        start,
        prefix(http, [-1, 7, 9], instance_id=instance),
        http("getCacheMeta", {"instance_id": instance, "block_keys": [-1, 7, 9]}),
    ):
        assert [[s["uri"] for s in loc["location_specs"]] for loc in resp["locations"]] == expected
        assert {s["name"] for loc in resp["locations"] for s in loc["location_specs"]} == {'tp"0%s', "tp\\1%"}
    assert expected[0][0].startswith("file://nfs_~2/") and "%25" in expected[0][0] and "%22" in expected[0][0]


def test_reads_skip_blocks_on_a_storage_that_may_not_serve(runtime, http, tmp_path, clock):
    for name in ("nfs_a", "nfs_b"):
        (tmp_path / name).mkdir()
        runtime.control.add_storage(
            StorageConfig.model_validate(
                {"global_unique_name": name, "nfs": {"root_path": str(tmp_path / name), "key_count_per_file": 4}}
            )
        )
    runtime.control.create_group(
        InstanceGroup.model_validate(
            {"name": "g1", "storage_candidates": ["nfs_a", "nfs_b"], "quota": {"capacity": 1 << 30}}
        )
    )
    register(http, "g1", "i1")
    write(http, [1, 2, 3, 4])  # on nfs_a, the first candidate
    runtime.control.set_storage_available("nfs_a", False)
    clock.advance(60)  # the config cache reloads
    write(http, [1, 2, 3, 4, 5, 6])  # only 5 and 6 are new: on nfs_b
    runtime.control.set_storage_available("nfs_a", True)
    runtime.control.set_storage_available("nfs_b", False)
    clock.advance(60)

    def served(query_type: str, **extra) -> list[bool]:
        resp = http(
            "getCacheLocation",
            {"instance_id": "i1", "query_type": query_type, "block_keys": [1, 2, 3, 4, 5, 6], **extra},
        )
        assert code(resp) == "OK", resp
        return [bool(loc["location_specs"][0]["uri"]) for loc in resp["locations"]]

    # The right-most window of blocks that will be served, not a window padded out.
    assert served("QT_REVERSE_ROLL_SW_MATCH", sw_size=2) == [False, False, True, True, False, False]
    assert served("QT_REVERSE_ROLL_SW_MATCH", sw_size=5) == [False] * 6
    assert served("QT_BATCH_GET") == [True] * 4 + [False] * 2
    assert served("QT_PREFIX_MATCH") == [True] * 4
    runtime.control.set_storage_available("nfs_b", True)
    clock.advance(60)
    assert served("QT_REVERSE_ROLL_SW_MATCH", sw_size=2) == [False] * 4 + [True, True]


def test_a_finish_names_the_blocks_removed_while_writing_as_not_committed(http, instance):
    """A removeCache during WRITING takes the block; the finish that reports it successful
    said plain OK, though it is never served (issue #28 item 11)."""
    start = http("startWriteCache", {"instance_id": "i1", "block_keys": [1, 2, 3]})
    assert code(start) == "OK" and len(start["locations"]) == 3
    assert code(http("removeCache", {"instance_id": "i1", "block_keys": [2]})) == "OK"
    fin = http(
        "finishWriteCache",
        {"instance_id": "i1", "write_session_id": start["write_session_id"], "success_blocks": {"offset": 3}},
    )
    assert code(fin) == "OK", fin
    assert fin["uncommitted_blocks"] == {"bool_masks": {"values": [False, True, False]}}
    assert "not committed" in fin["header"]["status"]["message"]
    metas = http("getCacheMeta", {"instance_id": "i1", "block_keys": [1, 2, 3]})["metas"]
    served = [json.loads(m)["status"] == "CLS_SERVING" for m in metas]
    assert served == [True, False, True]
    again = write(http, [4, 5])  # a finish with every block committed answers as before
    assert code(again) == "OK"


def test_a_finish_with_every_block_committed_has_no_uncommitted_field(http, instance):
    start = http("startWriteCache", {"instance_id": "i1", "block_keys": [7, 8]})
    fin = http(
        "finishWriteCache",
        {"instance_id": "i1", "write_session_id": start["write_session_id"], "success_blocks": {"offset": 2}},
    )
    assert code(fin) == "OK" and "uncommitted_blocks" not in fin, fin
