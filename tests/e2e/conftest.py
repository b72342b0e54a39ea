"""e2e fixtures: one local stack per e2e run (see ``harness``)."""
from __future__ import annotations

from typing import Iterator

import pytest

from chalicelib.local import LocalStack

from .harness import Api, e2e_stack


@pytest.fixture(scope="package")
def stack(tmp_path_factory) -> Iterator[LocalStack]:
    """One running stack for the e2e package (stopped before other packages run)."""
    with e2e_stack(tmp_path_factory.mktemp("e2e") / "state") as running:
        yield running


@pytest.fixture(scope="package")
def api(stack: LocalStack) -> Api:
    return Api(stack.api_url)
