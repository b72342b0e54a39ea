"""e2e fixtures: one local stack per e2e run (see ``harness``)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from local_stack import LocalStack

from .harness import Api, e2e_stack


def pytest_collection_modifyitems(items):
    """Every e2e test is ``slow``: it talks HTTP to a whole local stack run as processes
    (several run on the wall clock, Chromium or schemathesis). ``make test-fast`` skips them."""
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="package")
def stack(tmp_path_factory) -> Iterator[LocalStack]:
    """One running stack for the e2e package (stopped before other packages run)."""
    with e2e_stack(tmp_path_factory.mktemp("e2e") / "state") as running:
        yield running


@pytest.fixture(scope="package")
def api(stack: LocalStack) -> Api:
    return Api(stack.api_url)


@pytest.fixture
def auth_on(api: Api) -> Iterator[str]:
    """Auth turned on in the running stack for one test; yields an admin account's bearer."""
    from chalicelib.runtime import get_runtime

    user, password = f"e2e-admin-{uuid.uuid4().hex[:8]}", "violet-harbor-e2e-lantern"
    status, body = api.call("addAccount", {"user_name": user, "password": password, "role": "ROLE_ADMIN"})
    assert body["header"]["status"]["code"] == "OK", body
    runtime = get_runtime()
    settings = runtime.settings
    runtime.settings = dataclasses.replace(settings, auth_enabled=True)
    try:
        yield f"{user}:{password}"
    finally:
        runtime.settings = settings
