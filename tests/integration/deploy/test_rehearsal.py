"""Both deploy paths rehearsed on the local AWS (moto) and a local Valkey, then the
deployed functions invoked through the Lambda API at work on the deployed table.

The rehearsal runs in its own process (``python -m infra.rehearsal``): it patches moto's
backends (docs/deploy.md lists every workaround), which must not leak into the moto
server the other tests share.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.rehearsal import TOOLS_PYTHON
from local_stack.config import REPO_ROOT

pytestmark = pytest.mark.slow  # packages and deploys the app for real: 30-50 s a path


def rehearse(path: str, work_dir: Path) -> dict:
    report_file = work_dir / "report.json"
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "infra.rehearsal",
            "--work-dir",
            str(work_dir),
            "--path",
            path,
            "--report",
            str(report_file),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert report_file.exists(), process.stderr[-4000:]
    report = json.loads(report_file.read_text())
    failed = [step for step in report["steps"] if not step["ok"]]
    assert process.returncode == 0 and report["ok"], json.dumps(failed or report.get(path), indent=1)[-6000:]
    return report


def invoked(report: dict) -> list[str]:
    return [call["function"] for call in report["invocations"] if not call["failed"]]


def check_the_jobs(report: dict, path: str) -> None:
    jobs = report[path]
    # the deployed reaper expired the seeded session (3 blocks) on the deployed table...
    assert jobs["expired"] == {"expired": 1, "blocks": 3}
    # ... which handed the blocks to the deletion state machine, whose task ran the deployed code
    assert any("delete" in name.lower() for name in invoked(report))
    # reclaim ran a round over the seeded group
    assert not jobs["reclaim"]["skipped"] and [g["group"] for g in jobs["reclaim"]["groups"]] == ["g1"]
    # the reaper state machine's tasks are bound to the deployed functions
    assert any("continue" in name.lower() for name in invoked(report))
    # the API function, behind the first admin account made as the docs say
    api = jobs["api"]
    assert (api["anonymous"], api["admin"]) == (401, 200) and api["health"]["is_health"] is True


def step(report: dict, name: str) -> dict:
    return next(entry for entry in report["steps"] if entry["step"] == name)


def test_chalice_deploy_path(tmp_path: Path):
    """docs/deploy.md's path 2 as written: `make deploy-infra` (infra stack through
    CloudFormation, the stage filled from its outputs), `chalice deploy`."""
    report = rehearse("chalice", tmp_path)
    steps = [entry["step"] for entry in report["steps"]]
    assert steps[:3] == [
        "make deploy-infra STAGE=rehearsal",
        "stage rehearsal in .chalice/config.json",
        "chalice deploy --stage rehearsal",
    ]
    stage = step(report, "stage rehearsal in .chalice/config.json")["result"]
    variables = stage["environment_variables"]
    assert variables["KVCM_CONTROL_TABLE"] == "kvcm-control-rehearsal"
    assert variables["KVCM_REAPER_STATE_MACHINE_ARN"].endswith(":stateMachine:kvcm-rehearsal-write_session_reaper")
    assert (variables["KVCM_AUTH"], variables["KVCM_DEBUG_SERVICE"]) == ("true", "false")
    assert stage["subnet_ids"] and stage["security_group_ids"] and stage["iam_policy_file"] == "policy-rehearsal.json"
    # Chalice's names: kvcm-<stage>-<function>, the API function kvcm-<stage>
    assert set(invoked(report)) >= {"kvcm-rehearsal", "kvcm-rehearsal-expire_write_sessions", "kvcm-rehearsal-reclaim"}
    assert all(name == "kvcm-rehearsal" or name.startswith("kvcm-rehearsal-") for name in invoked(report))
    bound = step(report, "every deployed function logs into the stack's log group")["result"]
    assert "kvcm-rehearsal" in bound and "kvcm-rehearsal-reclaim" in bound  # the API handler, a job
    check_the_jobs(report, "chalice")


@pytest.mark.skipif(not TOOLS_PYTHON.exists(), reason="the SAM transform needs aws-sam-translator: run `make tools`")
def test_packaged_path(tmp_path: Path):
    """docs/deploy.md's path 1 as written: the artifact bucket, then `make deploy` (package,
    code and template through S3, one CloudFormation stack)."""
    report = rehearse("packaged", tmp_path)
    assert "EndpointURL" in step(report, "make deploy STAGE=dev BUCKET=kvcm-dev-artifacts")["result"]
    outputs = step(report, "the stack's outputs")["result"]
    assert outputs["ControlTableName"] == "kvcm-control-dev"
    assert outputs["EndpointURL"].startswith("https://")
    check_the_jobs(report, "packaged")
