"""Planner units: KV bytes from model shapes, storage prices, net per capacity, the KVCM
quota with its watermark, and the report's human output."""
from __future__ import annotations

import json

import pytest

from chalicelib.optimizer.cli import main
from tests.helpers import CONVERSATION


def test_report_command_prints_assumptions_and_gib(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["report", "--trace", str(CONVERSATION), "--format", "mooncake", "--out", str(out),
                 "--capacities", "1000,20000", "--policies", "lru", "--model", "llama-3.1-70b",
                 "--storage-tier", "ssd", "--storage-price", "ssd=0.001", "--workers", "1"]) == 0
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
    out = tmp_path / "r"
    assert main(["report", "--trace", str(CONVERSATION), "--format", "mooncake", "--out", str(out),
                 "--capacities", "1000", "--policies", "lru", "--kv-bytes-per-token", "1000",
                 "--used-percentage", "0.5", "--workers", "1"]) == 0
    assert "model given: 1000 B of KV per token" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["plan"]["block_bytes"] == 512_000
    assert report["quota"]["max_key_count"] == 2 * report["recommendation"]["capacity"]
    assert main(["report", "--trace", str(CONVERSATION), "--out", str(out),
                 "--used-percentage", "2"]) == 2
