"""Cold start: a fresh process imports the app and answers its first request.

Starts fresh Python processes the way Lambda starts a container (the app module imported,
then one API Gateway proxy event handed to ``app.app``), against a local Valkey and moto
holding one registered instance with 128 cached blocks, and prints per phase the median
of ``--runs`` processes: interpreter start (baseline: ``python -c pass``), ``import app``,
the first getCacheLocation (control-plane reads, Valkey connection, the read), the first
answered request counted from the process start, and the process's CPU time (user +
system, start to exit: steadier than wall time on a machine shared with other work).
The app (``app.py``, ``chalicelib/``) is copied to a temporary directory and compiled as
``make deploy`` packages it (unchecked-hash ``.pyc``; no process writes bytecode), the
processes getting the functions' environment variables of its ``.chalice/config.json``, or
left as sources with ``--sources`` (``chalice deploy``'s package: every cold start
compiles it). With ``--against REV`` the same phases are measured for the app as of git
revision REV, its processes taking turns with the working tree's, so both columns see the
same machine. Then the imports that cost most (``python -X importtime``, cumulative), to
say where lazy imports would pay.

With ``--instructions``, one more process per tree runs under valgrind's callgrind and the
bench prints the instructions it executed to its first answer (``import app`` alone, and
with the first request): a count that does not move with the machine's load, where wall
and CPU times on a shared machine can swing by a factor of two between runs.

With ``--snapstart``, one more process per run and tree starts the way a SnapStart container
does: ``import app`` and the snapshot hooks (``snapshot_restore_py``'s ``before_snapshot``
registry, what Lambda runs when it publishes a version), then from that point, as a container
restored from the snapshot would, the restore hooks and the first request: the latency the
function itself adds to a restored container (Lambda's restore of the memory is its own).

    .venv/bin/python bench/bench_cold_start.py [--runs 7] [--against REV] [--sources] [--instructions] [--snapstart]
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from py_compile import PycInvalidationMode
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench._common import valkey_server  # noqa: E402

TARGET_MS = 300

CHILD = """
import json, os, sys, time
t0 = time.perf_counter()
import app
t1 = time.perf_counter()
snapshot_ms = None
if os.environ.get("BENCH_SNAPSTART"):  # Lambda's SnapStart: init, the snapshot hooks, [snapshot], restore hooks
    import snapshot_restore_py
    for hook, args, kwargs in snapshot_restore_py.get_before_snapshot():
        hook(*args, **kwargs)
    restored = time.perf_counter()
    snapshot_ms = (restored - t1) * 1e3
    for hook, args, kwargs in snapshot_restore_py.get_after_restore():
        hook(*args, **kwargs)
    t1 = restored
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
                  "hits": hits, "answered_at": time.time(), "snapshot_ms": snapshot_ms}))
if len(sys.argv) > 2:  # counted to the answer: the interpreter's teardown left out
    sys.stdout.flush()
    os._exit(0)
"""


#: ``import app`` alone, counted to its end (teardown left out).
IMPORT_ONLY = "import os, sys, app; sys.stdout.flush(); os._exit(0)"


@dataclass
class Phases:
    """Per-process figures (ms) of one tree's fresh processes."""

    imports: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    #: SnapStart (``--snapstart``): the snapshot hooks (run when a version is published), and
    #: a restored container's restore hooks plus its first request.
    snapshot_hooks: list[float] = field(default_factory=list)
    restored_first: list[float] = field(default_factory=list)


@dataclass
class Fresh:
    """One fresh process: its start (epoch s), wall and CPU ms to exit, its output."""

    started: float
    wall_ms: float
    cpu_ms: float
    stdout: str
    stderr: str


def fresh(args: list[str], env: dict[str, str], cwd: Path = REPO_ROOT) -> Fresh:
    """Run one fresh interpreter to its exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started, t0 = time.time(), time.perf_counter()
    out = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    wall = (time.perf_counter() - t0) * 1e3
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e3
    return Fresh(started, wall, cpu, out.stdout, out.stderr)


def app_environment(tree: Path, env: dict[str, str], snapstart: bool = False) -> dict[str, str]:
    """The environment of a process of the app in ``tree``: ``env``, the variables every
    function gets (its ``.chalice/config.json``, top level: the stages' own are left out,
    the bench runs the local settings), the tree on the path; ``snapstart``: started as a
    SnapStart container (CHILD runs the snapshot, then the restore hooks)."""
    config = json.loads((tree / CHALICE_CONFIG).read_text(encoding="utf-8"))
    environment = {**env, **config.get("environment_variables", {}), "PYTHONPATH": str(tree)}
    if snapstart:
        environment["BENCH_SNAPSTART"] = "1"
    return environment


def answer(tree: Path, env: dict[str, str], body: str, snapstart: bool) -> tuple[Fresh, dict[str, Any]]:
    """One process of the app in ``tree`` answering its first getCacheLocation (128 hits), and its figures."""
    run = fresh(["-c", CHILD, body], app_environment(tree, env, snapstart), cwd=tree)
    figures: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["status"] == 200 and figures["hits"] == 128, figures
    return run, figures


def compile_what_it_imports(tree: Path, env: dict[str, str], body: str) -> None:
    """One untimed process of the app in ``tree`` that may write bytecode: the interpreter's
    own and the libraries' modules, wherever this environment has Python look for their
    bytecode (beside them, or under a ``PYTHONPYCACHEPREFIX`` such as the Makefile's, where
    the standard library has none at first), so that no timed process compiles them, as no
    Lambda container does (its package and runtime carry their bytecode)."""
    answer(tree, {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}, body, snapstart=True)


def first_answer(tree: Path, env: dict[str, str], body: str, into: Phases) -> None:
    """One cold start of the app in ``tree``: import, first getCacheLocation, figures into ``into``."""
    run, figures = answer(tree, env, body, snapstart=False)
    into.imports.append(figures["import_ms"])
    into.first.append(figures["first_ms"])
    into.answered.append((figures["answered_at"] - run.started) * 1e3)
    into.cpu.append(run.cpu_ms)


def restored_answer(tree: Path, env: dict[str, str], body: str, into: Phases) -> None:
    """One SnapStart container of the app in ``tree``: init and the snapshot hooks, then,
    as if restored there, the restore hooks and the first getCacheLocation."""
    _, figures = answer(tree, env, body, snapstart=True)
    into.snapshot_hooks.append(figures["snapshot_ms"])
    into.restored_first.append(figures["first_ms"])


def instructions(tree: Path, env: dict[str, str], args: list[str]) -> int:
    """Instructions (millions) one fresh process of the app in ``tree`` executes, under callgrind."""
    with tempfile.TemporaryDirectory() as directory:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={directory}/out", sys.executable, *args],
            cwd=tree,
            env=app_environment(tree, env),
            capture_output=True,
            text=True,
            check=True,
        )
    collected = re.search(r"Collected : (\d+)", out.stderr)
    assert collected, out.stderr
    return int(collected.group(1)) // 1_000_000


UNCHECKED_HASH = PycInvalidationMode.UNCHECKED_HASH
CHALICE_CONFIG = ".chalice/config.json"
#: What the deployment package is made of, of the repository (requirements aside).
APP_FILES = ("app.py", "chalicelib", CHALICE_CONFIG)


@contextmanager
def app_tree(revision: str | None, bytecode: bool) -> Iterator[Path]:
    """The app (``APP_FILES``) in a temporary directory: the working tree's, or as of git
    ``revision``; with its modules compiled like ``make deploy``'s package (unchecked-hash
    ``.pyc``), else sources only like ``chalice deploy``'s (each process compiles them)."""
    with tempfile.TemporaryDirectory(prefix="kvcm-cold-") as directory:
        root = Path(directory)
        if revision is None:
            shutil.copy2(REPO_ROOT / "app.py", root / "app.py")
            shutil.copytree(
                REPO_ROOT / "chalicelib", root / "chalicelib", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
            (root / CHALICE_CONFIG).parent.mkdir()
            shutil.copy2(REPO_ROOT / CHALICE_CONFIG, root / CHALICE_CONFIG)
        else:
            archive = subprocess.run(
                ["git", "archive", revision, *APP_FILES], cwd=REPO_ROOT, capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
        if bytecode:
            compileall.compile_file(root / "app.py", quiet=2, invalidation_mode=UNCHECKED_HASH)
            compileall.compile_dir(root / "chalicelib", quiet=2, workers=1, invalidation_mode=UNCHECKED_HASH)
        yield root


def top_imports(stderr: str, count: int) -> list[tuple[float, str]]:
    """The ``count`` imports of most cumulative time (ms) from ``-X importtime`` output,
    leaving out the ones inside another listed one."""
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line[len("import time:") :].split("|")
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
    parser.add_argument("--against", metavar="REV", help="also measure the app as of this git revision, in turns")
    parser.add_argument(
        "--sources",
        action="store_true",
        help="the app without bytecode (chalice deploy's package): every process compiles it",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count the instructions to the first answer, under valgrind's callgrind (slow: ~30 s a tree)",
    )
    parser.add_argument(
        "--snapstart",
        action="store_true",
        help="also a SnapStart container per run: the snapshot hooks, then restore hooks and first request",
    )
    args = parser.parse_args()
    from bench.bench_meta import build_runtime, write_blocks

    bytecode = not args.sources
    with (
        valkey_server() as client,
        tempfile.TemporaryDirectory() as data_dir,
        app_tree(None, bytecode) as tree,
        contextlib.ExitStack() as stack,
    ):
        previous = stack.enter_context(app_tree(args.against, bytecode)) if args.against else None
        rt, aws = build_runtime(client, data_dir, capacity_blocks=10_000)
        try:
            keys = [random.Random(3).getrandbits(63) for _ in range(128)]
            write_blocks(rt, keys)
            port = client.connection_pool.connection_kwargs["port"]
            # Nothing a process compiles is kept: each one is a new container.
            env = {**os.environ, "KVCM_VALKEY_URL": f"redis://127.0.0.1:{port}/0", "PYTHONDONTWRITEBYTECODE": "1"}
            env.pop("KVCM_EVENT_LOG", None)
            body = json.dumps({"instance_id": "bench", "query_type": "QT_PREFIX_MATCH", "block_keys": keys})
            for each in [tree] + ([previous] if previous is not None else []):
                compile_what_it_imports(each, env, body)
            interpreter, interpreter_cpu, current, before = [], [], Phases(), Phases()
            for _ in range(args.runs):
                baseline = fresh(["-c", "pass"], env)
                interpreter.append(baseline.wall_ms)
                interpreter_cpu.append(baseline.cpu_ms)
                first_answer(tree, env, body, current)
                if previous is not None:
                    first_answer(previous, env, body, before)
                if args.snapstart:
                    restored_answer(tree, env, body, current)
                    if previous is not None:
                        restored_answer(previous, env, body, before)
            importtime = fresh(
                ["-X", "importtime", "-c", "import app"],
                app_environment(tree, env),
                cwd=tree,
            ).stderr
            median = statistics.median

            def row(label: str, now: list[float], then: list[float], note: str = "") -> str:
                was = f"{median(then):>8.0f} ms" if then else ""
                return f"  {label:<40} {median(now):>8.0f} ms {was:>11}{note}"

            package = "sources only (chalice deploy)" if args.sources else "with bytecode (make deploy)"
            print(f"Cold start, median of {args.runs} fresh processes, {os.cpu_count()} cores, app {package}")
            print(f"  {'':<40} {'now':>11} {args.against or '':>11}")
            print(row("interpreter start and exit (baseline)", interpreter, []))
            print(row("import app", current.imports, before.imports))
            print(row("first getCacheLocation (128 hits)", current.first, before.first))
            print(
                row("process start to first answer", current.answered, before.answered, f"  (target ≤ {TARGET_MS} ms)")
            )
            print(
                row(
                    "CPU time, process start to exit",
                    current.cpu,
                    before.cpu,
                    f"  (baseline {median(interpreter_cpu):.0f} ms)",
                )
            )
            if args.snapstart:
                print("  SnapStart (Lambda's own snapshot restore not included):")
                print(row("snapshot hooks, at publish", current.snapshot_hooks, before.snapshot_hooks))
                print(
                    row(
                        "restore hooks + first getCacheLocation",
                        current.restored_first,
                        before.restored_first,
                        f"  (target ≤ {TARGET_MS} ms)",
                    )
                )
            if args.instructions:
                trees = [tree] + ([previous] if previous is not None else [])
                counts = [
                    (instructions(t, env, ["-c", IMPORT_ONLY]), instructions(t, env, ["-c", CHILD, body, "exit"]))
                    for t in trees
                ]
                print("  instructions executed (millions, callgrind, one process each):")
                for label, index in (("import app", 0), ("process start to first answer", 1)):
                    was = f"{counts[1][index]:>8} M" if len(counts) > 1 else ""
                    print(f"  {label:<40} {counts[0][index]:>8} M  {was:>10}")
            print("  costliest imports of `import app` (cumulative, one -X importtime run):")
            for ms, name in top_imports(importtime, 10):
                print(f"    {name:<50} {ms:>8.0f} ms")
        finally:
            aws.stop()


if __name__ == "__main__":
    main()
