"""The repository stands alone: a clone with no ``../shared`` beside it has every trace the
tests, benches and demo read, and CI (``.ci/run``) runs the suite in such a clone."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.helpers import CONVERSATION, EVENT_LOG, REPO_ROOT, TRACES

# The development workspace's traces, anywhere (docs included: a reader of a clone has none).
SHARED_TRACES = re.compile(r"shared/traces|\"shared\" */ *\"traces\"")
# Any path out of the checkout into the workspace's shared folder, in code (the docs may name
# the workspace's design notes).
SHARED_ANYTHING = re.compile(r"\.\./shared|\]? */ *\"shared\"")


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    return [REPO_ROOT / name for name in listed.decode().split("\0") if name]


def test_the_traces_are_in_the_repository_with_source_and_license():
    assert TRACES == REPO_ROOT / "traces"
    tracked = {p.relative_to(REPO_ROOT).as_posix() for p in tracked_files()}
    for trace in (CONVERSATION, EVENT_LOG):
        assert trace.is_file() and trace.relative_to(REPO_ROOT).as_posix() in tracked
    readme = (TRACES / "README.md").read_text(encoding="utf-8")
    for fact in ("mooncake_conversation.jsonl", "kvcache-ai/Mooncake", "FAST'25", "kvcm_event_publisher.log"):
        assert fact in readme
    assert "alibaba/tair-kvcache" in readme and readme.count("Apache-2.0") >= 2


def test_nothing_reads_outside_the_checkout():
    offenders = []
    for path in tracked_files():
        if path.resolve() == Path(__file__).resolve() or not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        offenders += [
            f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()}"
            for n, line in enumerate(text.splitlines(), 1)
            if SHARED_TRACES.search(line) or (path.suffix != ".md" and SHARED_ANYTHING.search(line))
        ]
    assert offenders == []


FAKE_MAKE = """#!/bin/sh
# Records where and how CI ran make, then writes a file into out/ as the tests do.
{{ echo "$*|$(pwd)|$(test -e ../shared && echo shared || echo alone)|$(test -f traces/README.md && echo traces)"; }} \\
    >> {log}
mkdir -p out/console-screenshots && echo "$*" > out/console-screenshots/made-by-$1.txt
"""


def test_ci_runs_lint_and_the_readme_test_command_in_a_clone_without_shared(tmp_path):
    """A development layout (a ``shared/`` beside the checkout): CI still runs in a clone that
    has none beside it, runs ``make lint`` then the README's test command once, and brings
    the tests' outputs (``out/``) back to the checkout."""
    if shutil.which("git") is None:
        pytest.skip("no git")
    workspace = tmp_path / "workspace"
    checkout = workspace / "kvcm"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(checkout)], check=True)
    (workspace / "shared" / "traces").mkdir(parents=True)
    # The CI script under test is this tree's (committed or not).
    shutil.copy2(REPO_ROOT / ".ci" / "run", checkout / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "make.log"
    fake = bin_dir / "make"
    fake.write_text(FAKE_MAKE.format(log=log))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    done = subprocess.run([str(checkout / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    calls = [line.split("|") for line in log.read_text().splitlines()]
    readme_test = re.search(r"^make (test)\s", (REPO_ROOT / "README.md").read_text(), re.MULTILINE)
    assert readme_test is not None
    assert [c[0] for c in calls] == ["lint", readme_test.group(1)]
    for _, cwd, beside, traces in calls:
        assert Path(cwd) != checkout and not Path(cwd).is_relative_to(checkout)
        assert beside == "alone" and traces == "traces"
    # The clone is gone, its outputs are the checkout's.
    assert not Path(calls[0][1]).exists()
    assert (checkout / "out" / "console-screenshots" / "made-by-test.txt").read_text() == "test\n"


def test_ci_fails_when_the_suite_fails(tmp_path):
    """The exit status of CI is the suite's, outputs copied back all the same."""
    if shutil.which("git") is None:
        pytest.skip("no git")
    checkout = tmp_path / "kvcm"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(checkout)], check=True)
    shutil.copy2(REPO_ROOT / ".ci" / "run", checkout / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "make"
    fake.write_text('#!/bin/sh\nmkdir -p out && echo "$*" > out/ran-$1\n[ "$1" != test ]\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    done = subprocess.run([str(checkout / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert (checkout / "out" / "ran-test").is_file()
