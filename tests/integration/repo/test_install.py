"""``pip install <repository>`` gives the SDK (``kvcm_client``), the CLI (``kvcm``) and the
relay (``kvcm-relay``), usable from a fresh venv outside the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, free_port

pytestmark = pytest.mark.slow  # a venv and a build: ~20-40 s

# The README's SDK example's imports, and a call: to a port nothing listens on, so the SDK's
# transport (urllib3) runs and fails as documented.
SDK_USE = textwrap.dedent(
    """
    import sys
    import chalicelib.protocol.models, kvcm_client
    from kvcm_client import KvcmClient, KvcmError, TransportError
    from chalicelib.protocol.models import BlockMask

    print(kvcm_client.__file__)
    print(chalicelib.protocol.models.__file__)
    with KvcmClient(sys.argv[1], token="", timeout_s=2) as kvcm:
        try:
            kvcm.check_health()
        except TransportError as exc:
            print("unreachable:", type(exc).__name__)
    """
)


def source_copy(destination: Path) -> Path:
    """The tracked files as they are in the working tree (a build writes build/ and
    *.egg-info into its source directory: not into the checkout the other tests read)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    for name in listed.decode().split("\0"):
        if name and not name.startswith(("traces/", "tests/")) and (REPO_ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, destination / name)
    return destination


def test_pip_install_gives_the_sdk_the_cli_and_the_relay_outside_the_tree(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("no git")
    source = source_copy(tmp_path / "source")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-4000:]

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(command), cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)

    cli = run(str(venv / "bin" / "kvcm"), "--help")
    assert cli.returncode == 0, cli.stderr
    assert "Manage and inspect a KVCM service" in cli.stdout and "group" in cli.stdout
    relay = run(str(venv / "bin" / "kvcm-relay"), "--help")
    assert relay.returncode == 0, relay.stderr
    assert "--instance-id" in relay.stdout and "--manager" in relay.stdout

    sdk = run(str(venv / "bin" / "python"), "-c", SDK_USE, f"http://127.0.0.1:{free_port()}")
    assert sdk.returncode == 0, sdk.stderr
    sdk_file, models_file, outcome = sdk.stdout.splitlines()
    site = venv.resolve()
    assert Path(sdk_file).resolve().is_relative_to(site) and Path(models_file).resolve().is_relative_to(site)
    assert outcome == "unreachable: TransportError"
