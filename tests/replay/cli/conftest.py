"""Fixtures of the CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli import TINY_REQUEST, write_jsonl


@pytest.fixture
def tiny_workload(tmp_path: Path) -> Path:
    """A one-request JSONL workload the tiny model serves in a few steps."""
    return write_jsonl(tmp_path / "w.jsonl", [TINY_REQUEST])
