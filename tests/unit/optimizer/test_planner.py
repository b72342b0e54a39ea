"""Planner units: KV bytes from model shapes, storage prices, net per capacity, the KVCM
quota with its watermark, and the report's human output."""

from __future__ import annotations

import json

import pytest

from chalicelib.optimizer.cli import main
from chalicelib.optimizer.cost import CostModel
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.planner import (
    MODEL_PRESETS,
    CapacityPlan,
    ModelPreset,
    for_people,
    human_bytes,
    model_preset,
    parse_prices,
    storage_tier,
)
from chalicelib.optimizer.replay import Totals
from chalicelib.optimizer.report import build_report, summary_lines
from chalicelib.optimizer.sweep import PointResult

from .synth import write_mooncake_trace


def test_kv_bytes_per_token_from_the_model_shape():
    # Llama 3.1 8B: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes = 128 KiB
    assert MODEL_PRESETS["llama-3.1-8b"].kv_bytes_per_token == 128 * 1024
    assert MODEL_PRESETS["llama-3.1-70b"].kv_bytes_per_token == 320 * 1024
    assert model_preset("Qwen2.5-7B", "fp8").kv_bytes_per_token == 28 * 1024
    with pytest.raises(ConfigError, match="unknown model preset"):
        model_preset("gpt-9")
    with pytest.raises(ConfigError, match="dtype"):
        ModelPreset("x", 1, 1, 1, 1.0, dtype="bf17")


def test_storage_prices_are_editable():
    assert storage_tier("SSD").storage_type == "ST_3FS"
    assert storage_tier("dram", parse_prices(["dram=0.5"])).gib_hour_price == 0.5
    for bad in (["dram"], ["dram=cheap"], ["tape=1"]):
        with pytest.raises(ConfigError):
            parse_prices(bad)
    with pytest.raises(ConfigError):
        storage_tier("dram", {"dram": -1.0})


def _plan(**kw):
    base = dict(
        block_size=16,
        kv_bytes_per_token=64 * 1024,
        model="m",
        tier=storage_tier("dram", {"dram": 0.01}),
        instances=2,
        used_fraction=0.8,
    )
    return CapacityPlan(**{**base, **kw})


def test_quota_includes_the_watermark_and_every_instance():
    plan = _plan()
    assert plan.block_bytes == 1024 * 1024 and plan.gib(1024) == 1.0
    quota = plan.quota("lru", 1000)
    assert quota["max_key_count"] == 1250  # 1000 / 0.8: reclaim starts at 80 %
    assert quota["group_quota_bytes"] == 2 * 1250 * 1024 * 1024
    config = quota["instance_group"]
    assert config["cache_config"]["meta_indexer_config"]["max_key_count"] == 1250
    assert config["cache_config"]["reclaim_strategy"]["trigger_strategy"] == {"used_percentage": 0.8}
    assert config["quota"]["quota_config"][0]["storage_type"] == "ST_MOONCAKE"
    # a policy simulated with KVCM's own watermark needs no more than it ran with
    assert plan.quota("kvcm", 1000, watermark_simulated=True)["max_key_count"] == 1000
    # storage of the quota: 1250 MiB x 2 instances at 0.01 per GiB-hour
    assert plan.storage_cost_per_hour(1000) == pytest.approx(2 * 1250 / 1024 * 0.01)
    with pytest.raises(ConfigError):
        _plan(used_fraction=1.5)


def test_net_rows_and_net_optimal_capacity():
    plan = _plan(instances=1)
    hits = {10: 100_000, 100: 400_000, 1000: 450_000}  # external hit tokens per capacity
    points = [
        PointResult(
            "lfu",
            c,
            None,
            Totals(
                reads=10,
                read_blocks=1000,
                external_hit_blocks=h // 16,
                input_tokens=16_000_000,
                hit_tokens=h,
                external_hit_tokens=h,
            ),
            "replay",
            0,
        )
        for c, h in hits.items()
    ]
    cost = CostModel(model_params=1e9, gpu_flops=1e12, mfu=1.0, gpu_hour_price=36.0)
    report = build_report(trace={}, settings={}, points=points, duration_s=3600, target=0.01, cost=cost, plan=plan)
    rows = {r["capacity_blocks"]: r for r in report["net"]}
    # 100k tokens x 2e9 FLOP / 1e12 FLOP/s = 200 GPU-s = 2.0 at 36 per GPU-hour
    assert rows[10]["gpu_cost_saved_per_hour"] == pytest.approx(2.0)
    assert rows[10]["storage_cost_per_hour"] == pytest.approx(13 / 1024 * 0.01)
    assert rows[1000]["net_per_hour"] == pytest.approx(9.0 - 1250 / 1024 * 0.01)
    assert report["net_optimal"]["capacity_blocks"] == 1000
    assert report["quota"]["max_key_count"] == 13  # the target is met at 10 blocks
    text = "\n".join(summary_lines(report))
    assert "KV per token" in text and "quota = cache / 0.8" in text and "net-optimal" in text
    assert "max_key_count 13 per instance" in text


def test_floats_are_rounded_for_people():
    assert for_people({"a": [0.123456, 1234567.8], "b": 3, "c": None, "d": 0.0}) == {
        "a": [0.1235, 1235000.0],
        "b": 3,
        "c": None,
        "d": 0.0,
    }
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(3 * 2**40) == "3 TiB"


def test_report_command_prints_assumptions_and_gib(tmp_path, capsys):
    trace = write_mooncake_trace(tmp_path / "trace.jsonl", seed=3)
    out = tmp_path / "r"
    assert (
        main(
            [
                "report",
                "--trace",
                str(trace),
                "--format",
                "mooncake",
                "--out",
                str(out),
                "--capacities",
                "1000,20000",
                "--policies",
                "lru",
                "--model",
                "llama-3.1-70b",
                "--storage-tier",
                "ssd",
                "--storage-price",
                "ssd=0.001",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "320 KiB of KV per token" in text and "0.001 USD/GiB-h" in text
    assert "block = 512 tokens = 160 MiB" in text
    report = json.loads((out / "report.json").read_text())
    assert report["plan"]["block_bytes"] == 512 * 320 * 1024
    assert report["cost_model"]["model_params"] == 70.6e9
    rec = report["recommendation"]
    assert rec["capacity_gib"] == pytest.approx(rec["capacity"] * 160 / 1024, rel=1e-3)
    # rounded for people: no float in the file has more than 4 significant digits
    assert len(repr(rec["block_hit_ratio"]).lstrip("0.")) <= 4


def test_kv_bytes_per_token_given_directly(tmp_path, capsys):
    trace = write_mooncake_trace(tmp_path / "trace.jsonl", seed=3)
    out = tmp_path / "r"
    assert (
        main(
            [
                "report",
                "--trace",
                str(trace),
                "--format",
                "mooncake",
                "--out",
                str(out),
                "--capacities",
                "1000",
                "--policies",
                "lru",
                "--kv-bytes-per-token",
                "1000",
                "--used-percentage",
                "0.5",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    assert "model given: 1000 B of KV per token" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["plan"]["block_bytes"] == 512_000
    assert report["quota"]["max_key_count"] == 2 * report["recommendation"]["capacity"]
    assert main(["report", "--trace", str(trace), "--out", str(out), "--used-percentage", "2"]) == 2
