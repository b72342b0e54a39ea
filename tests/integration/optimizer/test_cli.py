"""The command line, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

from chalicelib.optimizer.cli import main
from tests.helpers import CONVERSATION, EVENT_LOG, REPO_ROOT


def run_module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "chalicelib.optimizer", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_mrc_json_contract():
    done = run_module(
        "mrc", "--trace", str(CONVERSATION), "--format", "mooncake", "--capacities", "1000,5000", "--json"
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert list(data) == ["hit_ratio"] and list(data["hit_ratio"]) == ["1000", "5000"]
    assert round(data["hit_ratio"]["1000"], 5) == 0.04453
    assert round(data["hit_ratio"]["5000"], 5) == 0.11182


def test_help_explains_itself():
    done = run_module("--help")
    assert done.returncode == 0
    assert "examples:" in done.stdout and "mrc --trace" in done.stdout
    for command in ("replay", "mrc", "sweep", "report"):
        assert command in done.stdout


def test_mrc_auto_format_and_table(capsys):
    assert main(["mrc", "--trace", str(CONVERSATION), "--capacities", "20k", "--json", "--tokens"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert round(data["hit_ratio"]["20000"], 5) == 0.28782
    assert data["token_hit_ratio"]["20000"] > data["hit_ratio"]["20000"] * 0.99
    assert main(["mrc", "--trace", str(EVENT_LOG), "--capacities", "10,100"]) == 0
    assert "saturates at" in capsys.readouterr().out


def test_replay_sweep_and_report_commands(tmp_path, capsys):
    csv_path = tmp_path / "ts.csv"
    assert (
        main(
            ["replay", "--trace", str(EVENT_LOG), "--capacity", "200", "--policy", "lfu", "--timeseries", str(csv_path)]
        )
        == 0
    )
    assert "block hit ratio" in capsys.readouterr().out
    assert csv_path.read_text().startswith("instance,window_start_s")
    assert main(["replay", "--trace", str(EVENT_LOG), "--capacity", "200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["capacity"] == 200
    assert (
        main(
            [
                "sweep",
                "--trace",
                str(EVENT_LOG),
                "--capacities",
                "10,100",
                "--policies",
                "lru,random_lru",
                "--workers",
                "1",
                "--json",
            ]
        )
        == 0
    )
    assert len(json.loads(capsys.readouterr().out)["points"]) == 4
    out = tmp_path / "report"
    assert (
        main(
            [
                "report",
                "--trace",
                str(EVENT_LOG),
                "--out",
                str(out),
                "--capacities",
                "10,100,1000",
                "--policies",
                "lru,lfu",
                "--workers",
                "1",
                "--target",
                "0.5",
            ]
        )
        == 0
    )
    assert "reaches 50%" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["smallest_capacity"]["lru"]["capacity"] == 10
    assert (out / "hit_ratio_vs_capacity.png").exists() and (out / "hit_rate_over_time.png").exists()
