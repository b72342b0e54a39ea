"""The engines' own KV-event modules, loaded from their released wheels.

``make`` unpacks the wheels pinned in ``requirements-engines.txt`` with ``--no-deps`` into
``.venv/engines``, which is not on ``sys.path`` (their full dependencies need a GPU build).
The two modules the relay follows are loaded from there by path, with the few engine
imports around them stubbed; the stubs leave ``sys.modules`` as they found it, so nothing
else in the test process sees a fake ``vllm`` or ``sglang``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import sys
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ENGINES_DIR = Path(__file__).resolve().parents[2] / ".venv" / "engines"
VLLM_VERSION, SGLANG_VERSION = "0.33.0", "0.5.23"
MODULE_PATHS = {
    "vllm": "vllm/distributed/kv_events.py",
    "sglang": "sglang/srt/disaggregation/kv_events.py",
}


@dataclasses.dataclass
class _KVEventsConfig:
    """vLLM's ``KVEventsConfig`` as the publisher builds it (keyword fields only)."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = ""
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""


def _unreachable(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("the tests bind explicit endpoints: no network helper is called")


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _stubs(engine: str) -> dict[str, types.ModuleType]:
    if engine == "vllm":
        return {
            "vllm.logger": _module("vllm.logger", init_logger=logging.getLogger),
            "vllm.config.kv_events": _module("vllm.config.kv_events", KVEventsConfig=_KVEventsConfig),
            "vllm.utils.network_utils": _module(
                "vllm.utils.network_utils",
                get_ip=_unreachable,
                get_tcp_uri=_unreachable,
                is_valid_ipv6_address=_unreachable,
                split_zmq_path=_unreachable,
            ),
            "vllm.v1.core.kv_cache_utils": _module("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int),
        }
    return {
        "sglang.srt.runtime_context": _module("sglang.srt.runtime_context", get_parallel=_unreachable),
        "sglang.srt.utils.network": _module("sglang.srt.utils.network", NetworkAddress=object),
    }


@contextmanager
def _stubbed(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    names = set(modules)
    for name in list(modules):  # the parent packages of each stub
        parts = name.split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    saved = {name: sys.modules[name] for name in names if name in sys.modules}
    for name in sorted(names):
        sys.modules[name] = modules.get(name) or _module(name, __path__=[])
    try:
        yield
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def engines_missing_reason() -> str | None:
    """Why the engines' modules cannot be loaded, or None when they can."""
    missing = [path for path in MODULE_PATHS.values() if not (ENGINES_DIR / path).is_file()]
    if missing:
        return f"{ENGINES_DIR} lacks {', '.join(missing)}: run `make test-fast` (it installs requirements-engines.txt)"
    return None


def load(engine: str) -> types.ModuleType:
    """The engine's (``vllm`` or ``sglang``) own ``kv_events`` module from its wheel.

    Fails the test in CI (``CI=true``) when the wheels are missing; elsewhere skips it with
    the reason."""
    reason = engines_missing_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    name = f"_kvcm_engine_{engine}_kv_events"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ENGINES_DIR / MODULE_PATHS[engine])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with _stubbed(_stubs(engine)):
        spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def vllm_stored_batch(kv: types.ModuleType, hashes: list[int]) -> Any:
    """A vLLM ``KVEventBatch`` of one full-attention ``BlockStored`` of ``hashes`` (16-token
    blocks, no parent, no LoRA), built with the wheel's own classes (``kv`` is ``load("vllm")``)."""
    stored = kv.BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[0] * (16 * len(hashes)),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    return kv.KVEventBatch(ts=time.time(), events=[stored])
