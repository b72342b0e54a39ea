"""`make rehearse` ends with its verdict: every step, the failing one last, then PASS or FAIL
naming it; warnings the emulator printed are counted, not shown."""

from __future__ import annotations

from infra.rehearsal import verdict


def step(name: str, ok: bool, seconds: float = 1.0, error: str = "") -> dict:
    return {"step": name, "ok": ok, "seconds": seconds, **({"error": error} if error else {})}


def test_a_passing_rehearsal_ends_with_pass():
    report = {"steps": [step("make deploy-infra", True, 12.0), step("chalice deploy", True, 30.5)], "ok": True}
    lines = verdict(report, warning_count=20)
    assert lines[-1] == "PASS: 2 steps in 42.5 s (20 warnings of the emulator in the report)"
    assert lines[0].startswith("ok") and "make deploy-infra" in lines[0]


def test_the_failing_step_comes_last_and_the_last_line_names_it():
    report = {
        "steps": [
            step("make deploy-infra", True),
            step("chalice deploy", False, 3.0, "AssertionError: chalice deploy failed:\nboom"),
            step("the stack's outputs", True),
        ],
        "chalice": {"error": "AssertionError: chalice deploy failed"},
        "ok": False,
    }
    lines = verdict(report, warning_count=0)
    assert lines[-2].startswith("FAIL") and "chalice deploy" in lines[-2]
    assert lines[-1] == "FAIL: step 'chalice deploy': AssertionError: chalice deploy failed:"


def test_a_path_that_failed_outside_its_steps_is_named():
    report = {"steps": [step("make deploy", True)], "packaged": {"error": "KeyError: 'x'"}, "ok": False}
    assert verdict(report, warning_count=0)[-1] == "FAIL: packaged path: KeyError: 'x'"
