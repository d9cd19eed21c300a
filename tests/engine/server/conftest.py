"""The server tests' shared fixtures: a fake engine (``fake_engine.FakeEngine``, its context
256 tokens) and a test client over the app on it, one per module. A module that needs another
engine defines its own ``engine`` (``test_request_edges``: 64 tokens); its ``client`` follows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def engine() -> Any:
    pytest.importorskip("fastapi")
    from fake_engine import FakeEngine

    return FakeEngine(max_model_len=256)


@pytest.fixture(scope="module")
def client(engine: Any) -> Iterator[Any]:
    pytest.importorskip("fastapi")
    from fake_engine import app_client

    with app_client(engine) as test_client:
        yield test_client
