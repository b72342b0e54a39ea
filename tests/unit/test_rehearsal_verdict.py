"""`make rehearse` ends with its verdict: every step, the failing one last, then PASS or FAIL
naming it; warnings the emulator printed are counted, not shown."""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra import rehearsal
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


def test_a_step_without_an_error_text_still_gets_a_verdict():
    report = {"steps": [step("chalice deploy", False)], "ok": False}
    assert verdict(report, warning_count=0)[-1] == "FAIL: step 'chalice deploy': (no error text)"


class FailingRehearsal:
    """Stands in for the servers and the deploy paths: the verdict and the clean-up are
    what is under test. Its chalice path fails in its second step after the emulator
    logged a warning (as moto's CloudFormation does for each resource type it skips)."""

    work_dirs: list[Path] = []

    def __init__(self, work_dir: Path, port: int = 0) -> None:
        self.work_dir = work_dir
        self.report: dict = {"steps": []}
        self.code = SimpleNamespace(invocations=[])
        FailingRehearsal.work_dirs.append(work_dir)

    def __enter__(self) -> FailingRehearsal:
        (self.work_dir / "tmp" / "scratch.bin").write_bytes(b"x" * 1024)
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def chalice_path(self) -> dict:
        self.report["steps"].append(step("make deploy-infra STAGE=rehearsal", True))
        logging.getLogger("moto.cloudformation.parsing").warning("No Moto CloudFormation support for %s", "X::Y")
        warnings.warn("Tried to parse X::Y", UserWarning, stacklevel=1)
        self.report["steps"].append(step("chalice deploy --stage rehearsal", False, 2.0, "AssertionError: boom\nmore"))
        raise AssertionError("boom")

    def packaged_path(self) -> dict:
        self.report["steps"].append(step("make deploy STAGE=dev BUCKET=kvcm-dev-artifacts", True))
        return {}


class BrokenServers(FailingRehearsal):
    def __enter__(self) -> FailingRehearsal:
        raise OSError("valkey-server did not start")


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The rehearsal's default temporary directory is made under here."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    FailingRehearsal.work_dirs = []
    return tmp_path


def test_a_failed_step_ends_fail_naming_it_and_the_temporary_directory_is_removed(
    temp_root: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
):
    monkeypatch.setattr(rehearsal, "Rehearsal", FailingRehearsal)
    report_file = temp_root / "report.json"
    assert rehearsal.main(["--report", str(report_file)]) == 1
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert lines[-1] == "FAIL: step 'chalice deploy --stage rehearsal': AssertionError: boom"
    assert lines[-2].startswith("FAIL") and "chalice deploy" in lines[-2]
    # the emulator's log line and Python warning are in the report, not on the terminal
    assert "No Moto" not in out + err and "Tried to parse" not in out + err
    report = json.loads(report_file.read_text())
    assert "moto.cloudformation.parsing: No Moto CloudFormation support for X::Y" in report["warnings"]
    assert "UserWarning: Tried to parse X::Y" in report["warnings"]
    assert not report["ok"]
    # the other path still ran; the work directory (its scratch files too) is gone
    assert any(s["step"].startswith("make deploy STAGE=dev") for s in report["steps"])
    assert FailingRehearsal.work_dirs and not any(d.exists() for d in FailingRehearsal.work_dirs)


def test_servers_that_do_not_start_end_fail_naming_them(temp_root: Path, monkeypatch: pytest.MonkeyPatch, capfd):
    monkeypatch.setattr(rehearsal, "Rehearsal", BrokenServers)
    assert rehearsal.main(["--report", str(temp_root / "report.json")]) == 1
    out, _ = capfd.readouterr()
    assert out.splitlines()[-1] == "FAIL: the local AWS and Valkey: OSError: valkey-server did not start"
    assert not any(d.exists() for d in FailingRehearsal.work_dirs)


def test_a_passing_run_exits_0_and_removes_its_directory(temp_root: Path, monkeypatch: pytest.MonkeyPatch, capfd):
    class Passing(FailingRehearsal):
        def chalice_path(self) -> dict:
            self.report["steps"].append(step("chalice deploy --stage rehearsal", True))
            return {}

    monkeypatch.setattr(rehearsal, "Rehearsal", Passing)
    assert rehearsal.main(["--report", str(temp_root / "report.json")]) == 0
    out, _ = capfd.readouterr()
    assert out.splitlines()[-1].startswith("PASS: 2 steps")
    assert list(temp_root.iterdir()) == [temp_root / "report.json"]


def answer(status: int, code: str) -> dict:
    return {"statusCode": status, "body": json.dumps({"header": {"status": {"code": code, "message": ""}}})}


def test_an_answer_is_checked_by_status_and_header_code():
    ok = answer(200, "OK")
    assert rehearsal.expect_answer(ok, 200, "OK") is ok
    assert rehearsal.expect_answer(answer(401, "UNAUTHENTICATED"), 401, "UNAUTHENTICATED")["statusCode"] == 401


@pytest.mark.parametrize(
    "response",
    [
        answer(200, "INTERNAL_ERROR"),  # a handler that raised still answers HTTP 200
        answer(500, "OK"),
        {"statusCode": 200, "body": "not json"},
        {"statusCode": 200},
    ],
)
def test_a_wrong_answer_fails_its_step(response: dict):
    with pytest.raises(AssertionError, match="expected HTTP 200 OK"):
        rehearsal.expect_answer(response, 200, "OK")
