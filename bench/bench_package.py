"""Deployment package size and cold-start import time, against the package as it was.

Baseline: the package with boto3 in requirements.txt (bundling boto3/botocore/s3transfer,
as before they were left to the Lambda runtime). Current: the package `chalice package`
builds (what `chalice deploy` uploads), and the same with its modules compiled (what
`make deploy` uploads, `infra.deploy.with_bytecode`). Packages are built by `chalice
package` from copies of the project, unzipped, and `import app` is timed in fresh processes
the way Lambda starts one: `python -S -B` (no site-packages, no .pyc written: /var/task is
read-only) with the package first on the path and the runtime-provided boto3 (this venv's,
precompiled like the runtime's) after it.

Run: `.venv/bin/python bench/bench_package.py [--runs 7]`
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from infra.deploy import with_bytecode  # noqa: E402
from infra.rehearsal import PROJECT_FILES, RUNTIME_PACKAGES, copy_items  # noqa: E402

IMPORT_APP = "import time; t = time.perf_counter(); import app; print(time.perf_counter() - t)"


def build(work: Path, name: str, extra_requirements: str = "") -> Path:
    """`chalice package` of a copy of the project; returns its deployment.zip."""
    project = work / name
    copy_items(PROJECT_FILES, project)
    shutil.copytree(REPO_ROOT / ".chalice", project / ".chalice", ignore=shutil.ignore_patterns("deployed"))
    if extra_requirements:
        with (project / "requirements.txt").open("a") as requirements:
            requirements.write(extra_requirements)
    out = work / f"{name}-out"
    subprocess.run(
        [str(Path(sys.executable).parent / "chalice"), "package", "--stage", "dev", str(out)],
        cwd=project,
        env={**os.environ, "AWS_DEFAULT_REGION": "us-east-1"},
        check=True,
        capture_output=True,
    )
    return out / "deployment.zip"


def import_times(code_dir: Path, runtime_dir: Path, runs: int) -> list[float]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": f"{code_dir}:{runtime_dir}",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return [
        float(
            subprocess.run(
                [sys.executable, "-S", "-B", "-c", IMPORT_APP],
                cwd=code_dir,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()[-1]
        )
        for _ in range(runs)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    import boto3

    with tempfile.TemporaryDirectory(prefix="kvcm-bench-package-") as tmp:
        work = Path(tmp)
        runtime_dir = work / "lambda-runtime"
        runtime_dir.mkdir()
        site = Path(boto3.__file__).resolve().parents[1]
        for name in RUNTIME_PACKAGES:
            (runtime_dir / name).symlink_to(site / name)
        packages = {
            "baseline (boto3 bundled)": build(work, "baseline", "boto3>=1.40\n"),
            "chalice deploy (no boto3)": build(work, "current"),
        }
        compiled = work / "compiled.zip"
        compiled.write_bytes(with_bytecode(packages["chalice deploy (no boto3)"].read_bytes()))
        packages["make deploy (+ bytecode)"] = compiled
        rows = []
        for name, package in packages.items():
            unzipped_dir = work / f"{package.stem}-{len(rows)}"
            with zipfile.ZipFile(package) as archive:
                archive.extractall(unzipped_dir)
            times = import_times(unzipped_dir, runtime_dir, args.runs)
            unzipped = sum(p.stat().st_size for p in unzipped_dir.rglob("*") if p.is_file())
            rows.append((name, package.stat().st_size, unzipped, statistics.median(times), min(times)))
    print(f"{'package':<26}{'zip MB':>8}{'unzipped MB':>13}{'import app p50 ms':>19}{'min ms':>8}")
    for name, zipped, unzipped, median, best in rows:
        print(f"{name:<26}{zipped / 1e6:>8.1f}{unzipped / 1e6:>13.1f}{median * 1000:>19.0f}{best * 1000:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
