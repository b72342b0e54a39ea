"""The command line, as a user runs it."""

from __future__ import annotations

import pytest

from chalicelib.optimizer.cli import main, parse_capacities
from chalicelib.optimizer.errors import ConfigError


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
