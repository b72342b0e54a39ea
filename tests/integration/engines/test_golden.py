"""The golden KV-event payloads checked in under tests/engines/golden are what the engines'
own classes encode today (vLLM 0.33.0, SGLang 0.5.23 from .venv/engines)."""

from __future__ import annotations

from tests.engines.make_golden import GOLDEN, render


def test_golden_payloads_are_the_engines_encoding():
    assert GOLDEN.read_text() == render(), "run .venv/bin/python -m tests.engines.make_golden"
