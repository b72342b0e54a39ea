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

from chalicelib.local.config import REPO_ROOT
from infra.rehearsal import TOOLS_PYTHON


def rehearse(path: str, work_dir: Path) -> dict:
    report_file = work_dir / "report.json"
    process = subprocess.run([sys.executable, "-m", "infra.rehearsal", "--work-dir", str(work_dir), "--path", path,
                              "--report", str(report_file)], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=280)
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


def test_chalice_deploy_path(tmp_path: Path):
    """Infra stack through CloudFormation, the stage filled from its outputs, `chalice deploy`."""
    report = rehearse("chalice", tmp_path)
    steps = [step["step"] for step in report["steps"]]
    assert steps[:3] == ["deploy the infra stack (CloudFormation)", "configure the chalice stage from the stack outputs",
                         "chalice deploy --stage rehearsal"]
    assert all(name.startswith("kvcm-rehearsal-") for name in invoked(report))
    check_the_jobs(report, "chalice")


@pytest.mark.skipif(not TOOLS_PYTHON.exists(), reason="the SAM transform needs aws-sam-translator: run `make tools`")
def test_packaged_path(tmp_path: Path):
    """`make deploy`: the packaged template and code through S3, one CloudFormation stack."""
    report = rehearse("packaged", tmp_path)
    deployed = next(step for step in report["steps"] if step["step"].startswith("deploy the packaged stack"))
    assert deployed["result"]["ControlTableName"] == "kvcm-control-dev"
    assert deployed["result"]["EndpointURL"].startswith("https://")
    check_the_jobs(report, "packaged")
