"""The README's examples run as pasted (against the e2e stack instead of :8000)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from local_stack import LocalStack

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
LOCAL_URL = "http://127.0.0.1:8000"


def block(after_heading: str, language: str, index: int = 0) -> str:
    """The ``index``-th fenced block in ``language`` under the heading ``after_heading``."""
    section = README.split(f"\n{after_heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)[index]


def run_sh(script: str, stack: LocalStack, replacements: dict[str, str] | None = None, **env: str) -> list[str]:
    """Run ``script`` under ``bash -euo pipefail`` against ``stack`` (its URL for the local
    stack's, then each of ``replacements``); its output lines."""
    if shutil.which("jq") is None and not os.environ.get("CI"):
        pytest.skip("no jq (make test installs it)")
    script = script.replace(LOCAL_URL, stack.api_url)
    for local, here in (replacements or {}).items():
        script = script.replace(local, here)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "KVCM_URL": stack.api_url, **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_two_phase_example_runs_as_pasted_and_again(stack: LocalStack):
    script = block("## A two-phase write and a read", "sh").replace('"demo"', '"readme-demo"')
    first = [json.loads(line) for line in run_sh(script, stack)]
    assert [answer["header"]["status"]["code"] for answer in first] == ["OK"] * 4
    assert len(first[2]["locations"]) == 2  # 11 and 12 (14 was never written)
    # Pasted again: the finish's offset follows the start (0 or 1 new key, depending on
    # whether 12's deletion has finished), so every call is OK.
    again = [json.loads(line) for line in run_sh(script, stack)]
    assert [answer["header"]["status"]["code"] for answer in again] == ["OK"] * 4
    assert len(again[2]["locations"]) in (1, 2)


def test_the_cli_examples_run_as_pasted(stack: LocalStack):
    if not (REPO / ".venv" / "bin" / "kvcm").exists():
        pytest.skip("make builds .venv/bin/kvcm")
    lines = run_sh(block("## Operator tools: CLI, SDK, OpenAPI, console", "sh"), stack)
    assert any(line.startswith("team-a") and "40.0 GiB" in line for line in lines)  # the usage table
    assert "group team-a removed" in lines
    assert any(line.split()[:1] == ["5,000"] for line in lines)  # the mrc table


def test_the_sdk_example_runs_as_pasted(stack: LocalStack, capsys):
    code = block("## Operator tools: CLI, SDK, OpenAPI, console", "python").replace(LOCAL_URL, stack.api_url)
    run_sh(block("## A two-phase write and a read", "sh"), stack)  # registers "demo"
    exec(compile(code, "README.md", "exec"), {})
    found, used = capsys.readouterr().out.split()
    assert found == "2" and int(used) > 0


def test_the_tier_example_copies_blocks_to_s3_as_pasted(stack: LocalStack, tmp_path: Path):
    hot_root = tmp_path / "kvcm-hot"  # not /tmp/kvcm-hot: other runs may paste the example too
    lines = run_sh(
        block("## Tiers: blocks that move to a cheaper storage", "sh"),
        stack,
        {"http://127.0.0.1:4566": stack.aws_endpoint, "/tmp/kvcm-hot": str(hot_root)},
    )
    answers = [json.loads(line) for line in lines[:7]]
    assert [answer["header"]["status"]["code"] for answer in answers] == ["OK"] * 7, answers
    migrate, found = answers[5], answers[6]
    assert (migrate["accepted"], migrate["rejected"]) == ("3", "0")
    assert ":execution:tier_copy:copy-" in migrate["execution_arn"]
    uris = [spec["uri"] for location in found["locations"] for spec in location["location_specs"]]
    assert uris == [f"s3://cold_01/tiered/tp0/{key:016d}?size=4096" for key in (1, 2, 3)]
    assert lines[7].strip() == "4096"  # the object's bytes, read back from the bucket
    # DELETE_SOURCE hands the file copies to the batched_delete workflow once the S3 copies serve.
    source_dir = hot_root / "tiered" / "tp0"
    assert source_dir.is_dir()  # the script wrote the blocks there
    deadline = time.monotonic() + 20
    while any(source_dir.iterdir()):
        assert time.monotonic() < deadline, f"source files left: {sorted(p.name for p in source_dir.iterdir())}"
        time.sleep(0.1)
