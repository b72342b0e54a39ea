"""The command line, as a user runs it."""

from __future__ import annotations

import json

import pytest

from chalicelib.optimizer.cli import main, parse_capacities
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.shards import DEFAULT_S_MAX
from chalicelib.optimizer.tracegen import TraceShape, write_mooncake


def test_bad_input_exits_2_naming_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "hash_ids": [1]}\n{"timestamp": 1, "hash_ids": "x"}\n')
    assert main(["mrc", "--trace", str(bad), "--format", "mooncake", "--capacities", "1"]) == 2
    assert "bad.jsonl:2:" in capsys.readouterr().err
    assert main(["replay", "--trace", str(tmp_path / "missing.jsonl"), "--capacity", "1"]) == 2


def test_capacity_parsing():
    assert parse_capacities("1000, 20k,1.5M") == [1000, 20_000, 1_500_000]
    assert parse_capacities("log:1:1k:4") == [1, 10, 100, 1000]
    for bad in ("", "ten", "-5", "1.5", "log:1:10"):
        with pytest.raises(ConfigError):
            parse_capacities(bad)


def test_mrc_samples_by_default_and_checks_against_the_exact_curve_on_request(tmp_path, capsys):
    trace = tmp_path / "generated.jsonl"
    write_mooncake(TraceShape(distinct_blocks=20_000, seed=5), trace)
    base = ["mrc", "--trace", str(trace), "--format", "mooncake", "--capacities", "100,5000"]
    assert main([*base, "--s-max", "1024", "--check"]) == 0
    out = capsys.readouterr().out
    assert "fixed-size SHARDS estimate, s_max 1,024, final rate 0.05" in out
    assert "SHARDS error against the exact curve" in out and "over 40 log-spaced capacities" in out
    assert main(base) == 0  # the default s_max: the whole trace fits its exact top
    out = capsys.readouterr().out
    assert f"s_max {DEFAULT_S_MAX:,}, final rate 1" in out and "SHARDS error" not in out
    assert main([*base, "--exact", "--json"]) == 0
    exact = json.loads(capsys.readouterr().out)["hit_ratio"]
    assert main([*base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hit_ratio"] == pytest.approx(exact)


def test_mrc_sampling_settings_are_checked(tmp_path, capsys):
    trace = tmp_path / "generated.jsonl"
    write_mooncake(TraceShape(distinct_blocks=1000), trace)
    base = ["mrc", "--trace", str(trace), "--capacities", "10"]
    assert main([*base, "--s-max", "0"]) == 2
    assert "s_max must be >= 1" in capsys.readouterr().err
    assert main([*base, "--sample-rate", "2"]) == 2
    assert "sample_rate must be in (0, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # one way to build the curve at a time
        main([*base, "--exact", "--s-max", "10"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
