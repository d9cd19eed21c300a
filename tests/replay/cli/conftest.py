"""Fixtures of the CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli import TINY_REQUEST, write_jsonl

from replay.whatif.cost.model import CostModel


@pytest.fixture
def tiny_workload(tmp_path: Path) -> Path:
    """A one-request JSONL workload the tiny model serves in a few steps."""
    return write_jsonl(tmp_path / "w.jsonl", [TINY_REQUEST])


@pytest.fixture
def fits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources ``CostModel.fit`` was called on, during the test."""
    real = CostModel.fit.__func__  # type: ignore[attr-defined]
    calls: list[str] = []

    def recording_fit(cls: type, events: object, source: str = "", **kwargs: object) -> object:
        calls.append(source)
        return real(cls, events, source, **kwargs)

    monkeypatch.setattr(CostModel, "fit", classmethod(recording_fit))
    return calls
