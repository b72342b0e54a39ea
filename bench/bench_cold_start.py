"""Cold start: a fresh process imports the app and answers its first request.

Starts fresh Python processes the way Lambda starts a container (the app module imported,
then one API Gateway proxy event handed to ``app.app``), against a local Valkey and moto
holding one registered instance with 128 cached blocks, and prints per phase the median
of ``--runs`` processes: interpreter start (baseline: ``python -c pass``), ``import app``,
the first getCacheLocation (control-plane reads, Valkey connection, the read), and the
first answered request counted from the process start. Then the imports that cost most
(``python -X importtime``, cumulative), to say where lazy imports would pay.

    .venv/bin/python bench/bench_cold_start.py [--runs 7]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench._common import valkey_server  # noqa: E402

TARGET_MS = 300

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import app
t1 = time.perf_counter()
body = sys.argv[1]
event = {"resource": "/api/getCacheLocation", "path": "/api/getCacheLocation", "httpMethod": "POST",
         "headers": {"content-type": "application/json"}, "multiValueHeaders": {"content-type": ["application/json"]},
         "queryStringParameters": None, "multiValueQueryStringParameters": None, "pathParameters": None,
         "stageVariables": None, "body": body, "isBase64Encoded": False,
         "requestContext": {"resourcePath": "/api/getCacheLocation", "httpMethod": "POST",
                            "path": "/api/getCacheLocation", "requestId": "cold", "stage": "api",
                            "identity": {"sourceIp": "127.0.0.1"}}}

class Context:
    aws_request_id = "cold"
    function_name = "kvcm"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:kvcm"
    def get_remaining_time_in_millis(self):
        return 30000

response = app.app(event, Context())
t2 = time.perf_counter()
hits = len(json.loads(response["body"])["locations"])
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "first_ms": (t2 - t1) * 1e3, "status": response["statusCode"],
                  "hits": hits, "answered_at": time.time()}))
"""


def fresh(args: list[str], env: dict) -> tuple[float, float, str, str]:
    """One fresh process: its start (epoch s), its wall ms to exit, stdout and stderr."""
    started, t0 = time.time(), time.perf_counter()
    out = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         check=True)
    return started, (time.perf_counter() - t0) * 1e3, out.stdout, out.stderr


def top_imports(stderr: str, count: int) -> list[tuple[float, str]]:
    """The ``count`` imports of most cumulative time (ms) from ``-X importtime`` output,
    leaving out the ones inside another listed one."""
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line[len("import time:"):].split("|")
            rows.append((int(cumulative) / 1e3, name.rstrip()))
    rows.sort(reverse=True)
    picked: list[tuple[float, str]] = []
    for ms, name in rows:
        module = name.strip()
        if module == "app" or any(module.startswith(p.strip() + ".") for _, p in picked):
            continue
        picked.append((ms, name.strip()))
        if len(picked) == count:
            break
    return picked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    from bench.bench_meta import build_runtime, write_blocks

    with valkey_server() as client, tempfile.TemporaryDirectory() as data_dir:
        rt, aws = build_runtime(client, data_dir, capacity_blocks=10_000)
        try:
            keys = [random.Random(3).getrandbits(63) for _ in range(128)]
            write_blocks(rt, keys)
            port = client.connection_pool.connection_kwargs["port"]
            env = {**os.environ, "KVCM_VALKEY_URL": f"redis://127.0.0.1:{port}/0", "PYTHONPATH": str(REPO_ROOT)}
            env.pop("KVCM_EVENT_LOG", None)
            body = json.dumps({"instance_id": "bench", "query_type": "QT_PREFIX_MATCH", "block_keys": keys})
            interpreter, imports, first, answered = [], [], [], []
            for _ in range(args.runs):
                interpreter.append(fresh(["-c", "pass"], env)[1])
                started, _, out, _ = fresh(["-c", CHILD, body], env)
                figures = json.loads(out.strip().splitlines()[-1])
                assert figures["status"] == 200 and figures["hits"] == 128, figures
                imports.append(figures["import_ms"])
                first.append(figures["first_ms"])
                answered.append((figures["answered_at"] - started) * 1e3)
            importtime = fresh(["-X", "importtime", "-c", "import app"], env)[3]
            median = statistics.median
            print(f"Cold start, median of {args.runs} fresh processes, {os.cpu_count()} cores")
            print(f"  {'interpreter start and exit: python -c pass (baseline)':<52} {median(interpreter):>8.0f} ms")
            print(f"  {'import app':<52} {median(imports):>8.0f} ms")
            print(f"  {'first getCacheLocation (128 hits)':<52} {median(first):>8.0f} ms")
            print(f"  {'process start to first answer':<52} {median(answered):>8.0f} ms"
                  f"  (target ≤ {TARGET_MS} ms to the first answer)")
            print("  costliest imports of `import app` (cumulative, one -X importtime run):")
            for ms, name in top_imports(importtime, 10):
                print(f"    {name:<50} {ms:>8.0f} ms")
        finally:
            aws.stop()


if __name__ == "__main__":
    main()
