"""``python -m local_stack``: run the local stack until Ctrl-C or SIGTERM.

``python -m local_stack clean``: delete the stack's state directory (``make clean``),
refused while a stack runs on it.

Exit status: 0 after a requested stop, 2 when the stack cannot start or the state cannot
be cleaned (the message says which variable to change), 3 when its embedded Valkey kept
dying and the stack stopped, 130 when stopped while starting.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from .config import StackConfig
from .guard import StackStartError, StartCancelled, StateLock
from .valkey import stop_leftover_servers

EXIT_CANNOT_START = 2
EXIT_VALKEY_LOST = 3
EXIT_INTERRUPTED = 130
SIGNAL_POLL_S = 0.2


def _on_signal(stop: threading.Event) -> Callable[[int, object], None]:
    """A handler that only sets ``stop`` (raising from a handler could leave a lock held
    by the interrupted code, e.g. logging's); once: a second signal, during shutdown, gets
    the default action (immediate exit)."""

    def request_stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stop.set()

    return request_stop


def run(stop: threading.Event) -> int:
    """Start the stack, serve until ``stop`` is set, stop it."""
    from .stack import LocalStack

    stack = LocalStack()
    try:
        stack.start(stop)  # stops what it started if cancelled or failing
    except StartCancelled:
        print("KVCM local stack: stopped while starting", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    try:
        print(stack.banner(), flush=True)
        # Waking up regularly is what lets the handler run: the kernel may deliver the
        # signal to any of the stack's threads, and then a main thread blocked in an
        # untimed wait never returns to Python to run it (seen: a SIGTERM ignored for good).
        while not stop.wait(SIGNAL_POLL_S):
            pass
        print("KVCM local stack stopping...", flush=True)
    finally:
        stack.stop()
    if stack.failure:
        print(f"KVCM local stack: {stack.failure}", file=sys.stderr, flush=True)
        return EXIT_VALKEY_LOST
    print("KVCM local stack stopped", flush=True)
    return 0


def clean(config: StackConfig) -> int:
    """Delete the state directory under its lock (refused while a stack holds it), after
    stopping a Valkey a killed stack may have left running on it."""
    lock = StateLock(config.state_dir)
    if not config.state_dir.exists():
        return 0
    lock.acquire(hint=", then clean")
    try:
        stop_leftover_servers(config.valkey_dir)
        shutil.rmtree(config.state_dir)
    finally:
        lock.release()
    print(f"removed {config.state_dir}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["clean"]):
        print("usage: python -m local_stack [clean]", file=sys.stderr)
        return EXIT_CANNOT_START
    stop = threading.Event()
    signal.signal(signal.SIGINT, _on_signal(stop))
    signal.signal(signal.SIGTERM, _on_signal(stop))
    try:
        return clean(StackConfig.from_env()) if args else run(stop)
    except StackStartError as error:
        print(f"KVCM local stack: {error}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_START


if __name__ == "__main__":
    sys.exit(main())
