"""The relay as a sidecar: its /livez, /readyz and /metrics beside vLLM's own publisher, and
the ``kvcm-relay`` entry point (``connectors.__main__:main``) as a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import zmq

from connectors.__main__ import main
from connectors.sidecar import Sidecar

from .harness import HOST
from .test_relay import until
from .test_relay_engines import VllmEngine, free_port, start, visible


@pytest.fixture
def vllm():
    engine = VllmEngine()
    yield engine
    engine.close()


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in /metrics")


def test_metrics_and_readiness_follow_the_relay(http, er, vllm, context):
    relay = start(http, vllm, context)
    sidecar = Sidecar([relay], "127.0.0.1", 0).start()
    try:
        vllm.publish(vllm.stored([1, 2], list(range(8))))
        vllm.publish(vllm.stored([3], list(range(4)), group=1, kind="sliding_window"))
        visible(http, relay, [1, 2], {HOST: 2})
        until(lambda: relay.stats.cursor == 1)
        assert get(sidecar.port, "/livez")[0] == 200
        status, body = get(sidecar.port, "/readyz")
        assert (status, json.loads(body)) == (200, {"not_ready": {}})
        _, text = get(sidecar.port, "/metrics")
        assert metric(text, 'kvcm_relay_batches_total{dp_rank="0"}') == 2
        assert metric(text, 'kvcm_relay_blocks_stored_total{dp_rank="0"}') == 2
        assert metric(text, 'kvcm_relay_drops_total{dp_rank="0",kind="group not indexed"}') == 1
        assert (
            metric(text, 'kvcm_relay_cursor{dp_rank="0"}') == 1 and metric(text, 'kvcm_relay_ready{dp_rank="0"}') == 1
        )
        assert 0 <= metric(text, 'kvcm_relay_lag_seconds{dp_rank="0"}') < 60
        assert "# TYPE kvcm_relay_gaps_unfilled_total counter" in text
    finally:
        relay.stop()
    assert get(sidecar.port, "/livez")[0] == 503
    sidecar.stop()


def test_an_unknown_instance_fails_readiness(http, er, vllm, context):
    relay = start(http, vllm, context, instance_id="nosuch", retry_base_s=0.01, retry_max_s=0.05)
    sidecar = Sidecar([relay], "127.0.0.1", 0).start()
    try:
        vllm.publish(vllm.stored([1], list(range(4))))
        until(lambda: get(sidecar.port, "/readyz")[0] == 503 and "refused" in get(sidecar.port, "/readyz")[1])
        reasons = json.loads(get(sidecar.port, "/readyz")[1])["not_ready"]["0"]
        assert "INSTANCE_NOT_EXIST" in reasons["refused"] and "'nosuch'" in reasons["refused"]
        assert (
            metric(get(sidecar.port, "/metrics")[1], 'kvcm_relay_errors_total{dp_rank="0",kind="INSTANCE_NOT_EXIST"}')
            >= 1
        )
    finally:
        relay.stop()
        sidecar.stop()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dp-size", "2"], "--host-ip-port must name {dp_rank}"),
        (["--keys", "tokens"], "--keys tokens needs --block-size"),
        (["--media", "GPU"], "ENGINE_MEDIUM=KVCM_MEDIUM"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(extra, message, capsys):
    argv = ["--endpoint", "tcp://127.0.0.1:1", "--manager", "http://127.0.0.1:1", "--instance-id", "i"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--host-ip-port", "h:1", *extra])
    assert message in str(exc.value.code) + capsys.readouterr().err


def test_the_entry_point_runs_as_a_sidecar_process(tmp_path):
    """``python -m connectors`` (what the ``kvcm-relay`` script runs) beside vLLM's publisher,
    with KVCM down: alive, not ready (and why), its counters, the config logged without the
    API key, stopped by SIGTERM with exit code 0."""
    engine = VllmEngine()
    health = free_port()
    env = {**os.environ, "KVCM_API_KEY": "engine-secret-key"}
    argv = [
        sys.executable,
        "-m",
        "connectors",
        "--endpoint",
        engine.endpoint,
        "--replay-endpoint",
        engine.replay_endpoint,
    ]
    argv += [
        "--manager",
        f"http://127.0.0.1:{free_port()}",
        "--instance-id",
        "e1",
        "--host-ip-port",
        "10.0.0.8:{dp_rank}",
    ]
    argv += ["--dp-size", "1", "--health-host", "127.0.0.1", "--health-port", str(health), "--stats-s", "0.2"]
    log = tmp_path / "relay.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        engine.publish(engine.stored([1], [11, 22, 33, 44]))

        def answered() -> bool:
            try:
                return get(health, "/readyz")[0] == 503 and "unreachable" in get(health, "/readyz")[1]
            except OSError:
                return False

        until(answered, timeout_s=20)
        assert get(health, "/livez")[0] == 200
        assert metric(get(health, "/metrics")[1], 'kvcm_relay_errors_total{dp_rank="0",kind="unreachable"}') >= 1
        until(lambda: "relay stats (rank 0):" in log.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        engine.close()
    text = log.read_text()
    assert code == 0, text
    assert "config:" in text and '"token": "set"' in text and "engine-secret-key" not in text
    assert "11, 22" not in text and "[11" not in text, "token ids never reach the log"
