"""The ``kvcm`` command against the local stack: tables, --json, exit codes, one-line errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcm_client.cli import EXIT_ERROR, EXIT_UNHEALTHY, EXIT_UNREACHABLE, EXIT_USAGE, main
from local_stack import LocalStack

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def kvcm(stack: LocalStack, capsys, monkeypatch):
    """``kvcm(*args) -> (exit code, stdout, stderr)`` against the stack."""
    monkeypatch.setenv("KVCM_URL", stack.api_url)
    monkeypatch.delenv("KVCM_TOKEN", raising=False)

    def run(*args: str, stdin: str = ""):
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_storage_lifecycle_in_tables_and_json(kvcm, tmp_path):
    assert kvcm("storage", "add", "cli_nfs", "--nfs", str(tmp_path), "--key-count-per-file", "4")[0] == 0
    code, out, _ = kvcm("storage", "list")
    assert code == 0 and out.splitlines()[0].split() == ["NAME", "TYPE", "WHERE", "HEALTH", "REASON"]
    assert any(  # health: not probed yet, or by the stack's scheduled round meanwhile
        line.split()[:3] == ["cli_nfs", "ST_NFS", str(tmp_path)] and line.split()[3] in ("NOT_CHECKED", "HEALTHY")
        for line in out.splitlines()
    )
    code, out, _ = kvcm("--json", "storage", "get", "cli_nfs")
    assert code == 0 and json.loads(out)["nfs"] == {"root_path": str(tmp_path), "key_count_per_file": 4}
    assert kvcm("storage", "update", "cli_nfs", "--nfs", str(tmp_path), "--key-count-per-file", "2")[0] == 0
    assert json.loads(kvcm("--json", "storage", "get", "cli_nfs")[1])["nfs"]["key_count_per_file"] == 2
    assert kvcm("storage", "disable", "cli_nfs")[0] == 0 and kvcm("storage", "enable", "cli_nfs")[0] == 0
    code, _, err = kvcm("storage", "add", "cli_nfs", "--nfs", str(tmp_path))
    assert code == EXIT_ERROR and err.count("\n") == 1 and "DUPLICATE_ENTITY" in err
    assert kvcm("storage", "remove", "cli_nfs")[0] == 0
    assert kvcm("storage", "get", "cli_nfs")[0] == EXIT_ERROR


def test_group_instance_and_usage(kvcm):
    assert kvcm("group", "add", "cli_g", "--storage", "nfs_01", "--quota", "1MiB", "--watermark", "0.5")[0] == 0
    code, out, _ = kvcm("--json", "group", "get", "cli_g")
    group = json.loads(out)
    assert group["quota"]["capacity"] == str(2**20) and group["storage_candidates"] == ["nfs_01"]
    assert group["cache_config"]["reclaim_strategy"]["trigger_strategy"]["used_percentage"] == 0.5
    code, out, _ = kvcm("group", "update", "cli_g", "--quota", "2MiB")
    assert code == 0 and "version" in out
    assert json.loads(kvcm("--json", "group", "get", "cli_g")[1])["quota"]["capacity"] == str(2 * 2**20)
    assert (
        kvcm(
            "instance",
            "add",
            "cli_i",
            "--group",
            "cli_g",
            "--block-size",
            "16",
            "--spec",
            "tp0=4KiB",
            "--model",
            "qwen",
            "--dtype",
            "bf16",
        )[0]
        == 0
    )
    code, out, _ = kvcm("instance", "list", "--group", "cli_g")
    assert code == 0 and out.splitlines()[1].split()[:4] == ["cli_i", "cli_g", "16", "tp0=4.0"]
    from kvcm_client import KvcmClient

    with KvcmClient(os.environ["KVCM_URL"]) as client:
        session = client.start_write_cache(instance_id="cli_i", block_keys=[1, 2, 3]).write_session_id
        client.finish_write_cache(instance_id="cli_i", write_session_id=session, success_blocks={"offset": 3})
    code, out, _ = kvcm("usage", "--group", "cli_g")
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[:3] == ["GROUP", "QUOTA", "USED"]
    assert row.split()[:9] == ["cli_g", "2.0", "MiB", "12.0", "KiB", "0.6%", "1.0", "MiB", "3"]
    assert "cli_i 12.0 KiB" in row
    usage = json.loads(kvcm("--json", "usage", "--group", "cli_g")[1])["usage"][0]
    assert (usage["used_bytes"], usage["key_count"], usage["watermark_bytes"]) == (str(3 * 4096), "3", str(2**20))
    code, _, err = kvcm("group", "remove", "cli_g")
    assert code == EXIT_ERROR and err.startswith("kvcm: error: removeInstanceGroup:") and err.count("\n") == 1
    assert kvcm("instance", "remove", "cli_i")[0] == 0
    assert kvcm("group", "remove", "cli_g")[0] == 0


def test_accounts_take_the_password_from_stdin_or_the_environment(kvcm, monkeypatch):
    assert kvcm("account", "add", "cli_ops", "--role", "admin", "--password-stdin", stdin="s3cret-password-1\n")[0] == 0
    monkeypatch.setenv("KVCM_NEW_PASSWORD", "other-password-2")
    assert kvcm("account", "add", "cli_user")[0] == 0
    code, out, _ = kvcm("account", "list")
    rows = [line.split() for line in out.splitlines()]
    assert ["cli_ops", "ROLE_ADMIN"] in rows and ["cli_user", "ROLE_USER"] in rows
    monkeypatch.delenv("KVCM_NEW_PASSWORD")
    code, _, err = kvcm("account", "add", "cli_nopass")
    assert (
        code == EXIT_USAGE
        and err == "kvcm: error: no password: use --password-stdin, KVCM_NEW_PASSWORD or a terminal\n"
    )
    assert kvcm("account", "remove", "cli_ops")[0] == 0 and kvcm("account", "remove", "cli_user")[0] == 0


def test_health_and_metrics(kvcm):
    code, out, _ = kvcm("health")
    assert code == 0 and out.splitlines()[1].split()[0] == "yes"
    assert json.loads(kvcm("--json", "health")[1])["is_health"] is True
    code, out, _ = kvcm("metrics", "--filter", "service.query_counter")
    assert code == 0 and any(
        "api_name=CheckHealth" in line or "api_name=checkHealth" in line for line in out.splitlines()
    )
    code, out, _ = kvcm("metrics", "--prometheus")
    assert code == 0 and "# TYPE" in out


def test_errors_are_one_line_with_meaningful_exit_codes(kvcm, monkeypatch):
    code, _, err = kvcm("group", "add", "x", "--quota", "lots")
    assert code == EXIT_USAGE and err.count("\n") == 1 and "'lots' is not a size" in err
    code, _, err = kvcm("group", "get", "no-such-group")
    assert code == EXIT_ERROR and err.count("\n") == 1 and "INVALID_ARGUMENT" in err
    code, _, err = kvcm("--url", "http://127.0.0.1:9", "--timeout", "1", "account", "list")
    assert code == EXIT_UNREACHABLE and err.startswith("kvcm: error: cannot reach KVCM at http://127.0.0.1:9")


def test_trace_wraps_the_optimizer(kvcm, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 1536, "output_length": 10, "hash_ids": ids}) + "\n"
            for t, ids in ((0, [1, 2, 3]), (1000, [1, 2, 4]), (2000, [1, 2, 3]))
        )
    )
    code, out, _ = kvcm(
        "--json", "trace", "mrc", "--trace", str(trace), "--format", "mooncake", "--capacities", "1,100"
    )
    # 9 block reads; with room for everything the 2nd request hits 2 blocks and the 3rd 3.
    assert code == 0 and json.loads(out)["hit_ratio"]["100"] == pytest.approx(5 / 9)
    assert kvcm("trace", "mrc", "--trace", str(tmp_path / "missing.jsonl"), "--capacities", "1")[0] == EXIT_USAGE


def test_events_tail_prints_the_last_events(kvcm, tmp_path):
    log = tmp_path / "events.log"
    log.write_text(
        "".join(
            json.dumps(
                {
                    "type": "GetCacheLocation",
                    "source": f"inst{i}",
                    "trigger_time_us": 0,
                    "keys": [1, 2],
                    "query_type": "prefix_match",
                }
            )
            + "\n"
            for i in range(5)
        )
    )
    code, out, _ = kvcm("events", "tail", "--file", str(log), "-n", "2")
    assert code == 0 and [line.split()[2] for line in out.splitlines()] == ["inst3", "inst4"]
    code, out, _ = kvcm("--json", "events", "tail", "--file", str(log), "-n", "1")
    assert json.loads(out)["source"] == "inst4"
    assert kvcm("events", "tail", "--file", str(tmp_path / "none.log"))[0] == EXIT_USAGE


def test_the_installed_command(stack: LocalStack):
    script = REPO / ".venv" / "bin" / "kvcm"
    if not script.exists():
        pytest.skip("make builds .venv/bin/kvcm")
    done = subprocess.run(
        [str(script), "--url", stack.api_url, "--json", "health"], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert done.returncode == 0 and json.loads(done.stdout)["is_health"] is True


def test_a_refusal_exits_4_and_the_token_comes_from_kvcm_token(kvcm, auth_on, monkeypatch):
    from kvcm_client.cli import EXIT_REFUSED

    code, _, err = kvcm("storage", "list")
    assert code == EXIT_REFUSED and err.startswith("kvcm: error: refused (HTTP 401)") and err.count("\n") == 1
    monkeypatch.setenv("KVCM_TOKEN", auth_on)
    assert kvcm("storage", "list")[0] == 0


def test_health_names_a_group_without_storage_and_exits_5(kvcm, tmp_path):
    """Issue 23 item 4: the only storage of a group gone, ``kvcm health`` says which group,
    which storage and why, exits 5, and ``kvcm storage list`` shows it; back to 0 once restored."""
    from chalicelib.runtime import get_runtime

    root = tmp_path / "mount"
    root.mkdir()
    assert kvcm("storage", "add", "cli_gone", "--nfs", str(root))[0] == 0
    assert kvcm("group", "add", "cli_gone_g", "--storage", "cli_gone", "--quota", "1GiB", "--watermark", "0.8")[0] == 0
    runtime = get_runtime()
    backend = runtime.storages.backend(runtime.control.get_storage("cli_gone").config)
    try:
        root.rename(tmp_path / "moved")
        for _ in range(2):  # the two failed probes a scheduled round makes CONFIRM_DELAY_S apart
            runtime.storage_prober.probe([backend], 1.0, confirm=False)
        code, out, _ = kvcm("health")
        assert code == EXIT_UNHEALTHY
        assert "UNHEALTHY: instance group 'cli_gone_g' has no storage to write to: cli_gone: UNAVAILABLE" in out
        assert any(line.split()[:2] == ["cli_gone", "UNAVAILABLE"] and str(root) in line for line in out.splitlines())
        assert any(line.split()[:2] == ["cli_gone_g", "NO_WRITABLE_STORAGE"] for line in out.splitlines())
        code, out, _ = kvcm("--json", "health")
        assert code == EXIT_UNHEALTHY and json.loads(out)["degraded_groups"][0]["instance_group_name"] == "cli_gone_g"
        code, out, _ = kvcm("storage", "list")
        assert code == 0 and any(
            line.split()[:4] == ["cli_gone", "ST_NFS", str(root), "UNAVAILABLE"] and "cannot write in" in line
            for line in out.splitlines()
        )
        (tmp_path / "moved").rename(root)
        for _ in range(2):
            runtime.storage_prober.probe([backend], 1.0, confirm=False)
        assert kvcm("health")[0] == 0
    finally:
        kvcm("group", "remove", "cli_gone_g")
        kvcm("storage", "remove", "cli_gone")
