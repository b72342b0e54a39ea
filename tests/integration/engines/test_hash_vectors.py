"""The checked-in golden block-key vectors (tests/engines/hash_vectors.json) are what the
engines' released wheels compute: made again here from vLLM 0.33.0's and SGLang 0.5.23's
own hashing code in ``.venv/engines`` (``make``; requirements-engines.txt). Without the
wheels these tests skip locally and fail in CI (``CI=true``), where ``make test`` installs
them."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.engines import make_hash_vectors as gen

CHECKED_IN = json.loads(gen.VECTORS.read_text())["cases"]


def _need(present: bool, message: str) -> None:
    if present:
        return
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _need_wheel(path, what: str) -> None:
    _need(path.exists(), f"{what} is not in {gen.ENGINES_DIR} (make installs requirements-engines.txt)")


def _checked_in(engine: str) -> list[dict]:
    return [case for case in CHECKED_IN if case["engine"].startswith(engine)]


def test_vllm_computes_the_checked_in_vectors():
    _need_wheel(gen.ENGINES_DIR / "vllm" / "v1" / "core" / "kv_cache_utils.py", "vLLM's wheel")
    assert gen.vllm_cases() == _checked_in("vllm==")


@pytest.mark.slow  # compiles SGLang's C++ page hash once per .venv (cached in .venv/engines-build)
def test_sglang_computes_the_checked_in_vectors():
    _need_wheel(gen.ENGINES_DIR / "sglang" / "srt" / "mem_cache" / "cpp_utils" / "hash_binding.cpp", "SGLang's wheel")
    _need(shutil.which("g++") is not None, "g++ is needed to build SGLang's page hash")
    assert gen.sglang_cases() == _checked_in("sglang==")


def test_the_xxh_vectors_follow_the_documented_layout():
    assert gen.xxh_cases() == _checked_in("xxhash")
