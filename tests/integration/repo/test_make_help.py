"""`make` with no target lists the targets (it used to build the venv)."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_make_alone_prints_the_help():
    if shutil.which("make") is None:
        pytest.skip("no make")
    done = subprocess.run(["make", "--no-print-directory"], cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[0] == "KVCM developer commands (make <target>):"
    assert {line.split()[0] for line in lines[1:]} >= {"help", "run", "test", "clean", "package", "bench", "demo"}
