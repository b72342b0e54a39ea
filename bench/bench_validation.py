"""What a hostile body costs to refuse (issue 28.4): lists of bad items, over-long lists.

Each body goes through ``protocol.wire``'s decoding and validation as the dispatcher runs
them (``decode_body`` then ``parse_model``, the limits the default settings give), beside
``json.loads`` of the same text in the same run: the decoding every body costs anyway. A
refusal should cost about that, whatever the number of bad items; and the answer's
message stays short.

    .venv/bin/python bench/bench_validation.py
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import row


def _best_ms(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best wall time of ``repeat`` calls in ms (single calls of 10 ms to seconds)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    from chalicelib.protocol.errors import InvalidArgumentError
    from chalicelib.protocol.models import GetCacheLocationRequest, RegisterInstanceRequest, StartWriteCacheRequest
    from chalicelib.protocol.wire import ParseLimits, decode_body, parse_model
    from chalicelib.settings import Settings

    limits = ParseLimits(Settings().max_keys_per_request)
    spec = {"name": "tp0", "size": "x"}
    names = "location_spec_group_names"
    bodies: list[tuple[str, type, dict[str, object]]] = [
        ("getCacheLocation: 500,000 bad block_keys", GetCacheLocationRequest, {"block_keys": ["x"] * 500_000}),
        ("getCacheLocation: 500,000 bad token_ids", GetCacheLocationRequest, {"token_ids": ["x"] * 500_000}),
        ("startWriteCache: 500,000 bad group names", StartWriteCacheRequest, {names: [1] * 500_000}),
        ("registerInstance: 100,000 bad specs", RegisterInstanceRequest, {"location_spec_infos": [spec] * 100_000}),
        ("getCacheLocation: 500,000 good block_keys", GetCacheLocationRequest, {"block_keys": list(range(500_000))}),
    ]
    print(f"refusing hostile bodies (best of 3; baseline: json.loads of the same body; limits {limits})")
    for label, model, data in bodies:
        text = json.dumps(data)
        message = ""

        def refuse(text: str = text, model: type = model) -> None:
            nonlocal message
            try:
                parse_model(model, decode_body(text), limits)
            except InvalidArgumentError as err:
                message = str(err)

        baseline = _best_ms(lambda text=text: json.loads(text))
        print(f"{label} ({len(text) / 1e6:.1f} MB)")
        print(row("json.loads (baseline)", baseline, unit="ms"))
        print(row("decode + validate", _best_ms(refuse), baseline, unit="ms"))
        print(f"    message: {len(message)} chars: {message[:150]}")


if __name__ == "__main__":
    main()
