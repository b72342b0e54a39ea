"""The garbage collector waits while the app is imported (chalicelib/coldstart.py), in a
fresh interpreter each: an ``import app`` leaves it on, the app's modules frozen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, json, sys
{before}
import chalicelib.coldstart
paused = not gc.isenabled()
import {module}
print(json.dumps({{"paused": paused, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                   "app_modules": sum(name.startswith("chalicelib.") for name in sys.modules)}}))
"""


def probe(module: str, before: str = "") -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module, before=before)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_importing_the_app_pauses_the_collector_then_resumes_it_with_the_modules_frozen() -> None:
    state = probe("app")
    assert state["paused"] is True
    assert state["enabled"] is True
    assert isinstance(state["frozen"], int) and state["frozen"] > 10_000
    assert isinstance(state["app_modules"], int) and state["app_modules"] > 50


def test_the_runtime_alone_resumes_it_too() -> None:
    state = probe("chalicelib.runtime")
    assert state["paused"] is True and state["enabled"] is True


def test_a_process_that_had_the_collector_off_keeps_it_off() -> None:
    state = probe("app", before="gc.disable()")
    assert state["enabled"] is False
    assert state["frozen"] == 0


BLOCK = """
import gc, json
import chalicelib.coldstart as coldstart
coldstart.resume()
{before}
frozen = gc.get_freeze_count()
with coldstart.paused():
    inside = gc.isenabled()
    kept = [[i] for i in range(1000)]
print(json.dumps({{"inside": inside, "after": gc.isenabled(), "newly_frozen": gc.get_freeze_count() - frozen}}))
"""


def block(before: str = "") -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", BLOCK.format(before=before)], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_a_paused_block_freezes_what_it_built() -> None:
    state = block()
    assert state["inside"] is False and state["after"] is True
    assert isinstance(state["newly_frozen"], int) and state["newly_frozen"] >= 1000


def test_a_paused_block_leaves_a_collector_that_was_off_alone() -> None:
    assert block(before="gc.disable()") == {"inside": False, "after": False, "newly_frozen": 0}
