"""The JSON examples of docs/optimizer.md are inputs the service takes: valid JSON, and S3
bucket names S3 accepts (3-63 lowercase letters, digits, dots and hyphens)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "optimizer.md"
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def buckets(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "bucket":
                yield item
            yield from buckets(item)
    elif isinstance(value, list):
        for item in value:
            yield from buckets(item)


def test_the_sweep_examples_name_valid_buckets():
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    named = [name for block in blocks for name in buckets(json.loads(block))]
    assert named, "docs/optimizer.md has no sweep input example"
    assert [name for name in named if not BUCKET_NAME.fullmatch(name)] == []
