"""``python -m chalicelib.local``: run the local stack until Ctrl-C or SIGTERM."""
from __future__ import annotations

import signal
import sys
import threading

from .stack import LocalStack


def main() -> int:
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        # A second signal during shutdown falls back to the default (immediate exit).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    stack = LocalStack().start()
    try:
        print(stack.banner(), flush=True)
        stop.wait()
        print("KVCM local stack stopping...", flush=True)
    finally:
        stack.stop()
    print("KVCM local stack stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
