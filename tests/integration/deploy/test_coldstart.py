"""The garbage collector waits while the app is imported (chalicelib/coldstart.py), in a
fresh interpreter each: an ``import app`` leaves it on, the app's modules frozen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import gc, json, sys
at_start = gc.get_freeze_count()  # 3.12's interpreter starts with some objects frozen
{before}
import chalicelib.coldstart
paused = not gc.isenabled()
import {module}
print(json.dumps({{"paused": paused, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count() - at_start,
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


SNAPSHOT_PROBE = """
import json, socket
import snapshot_restore_py
import app
from chalicelib import runtime
from chalicelib.protocol import wire

def refuse(*args, **kwargs):
    raise AssertionError("a snapshot hook connected")

socket.socket.connect = socket.socket.connect_ex = refuse
for hook, args, kwargs in snapshot_restore_py.get_before_snapshot():
    hook(*args, **kwargs)
loader = runtime._shared_data_loader()
print(json.dumps({"unbuilt_after": wire.build_models(), "runtime_built": runtime._runtime is not None,
                  "cached_models": sorted({key[1] for key in loader._cache if key[0] == "load_service_model"})}))
"""


def test_the_snapshot_hook_builds_the_models_and_the_aws_models_without_connecting() -> None:
    """What Lambda runs before it snapshots a SnapStart version: every wire model built,
    botocore's service models of the runtime's clients loaded, no socket, no runtime."""
    out = subprocess.run(
        [sys.executable, "-c", SNAPSHOT_PROBE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    state = json.loads(out.stdout)
    assert state["unbuilt_after"] == 0
    assert state["runtime_built"] is False
    assert set(state["cached_models"]) >= {"dynamodb", "s3", "stepfunctions", "secretsmanager"}
