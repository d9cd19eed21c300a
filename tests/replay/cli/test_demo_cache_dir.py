"""``replayllm demo`` where the tiny model's cache cannot be made (``$REPLAYLLM_CACHE`` naming
a file or a path under one, a read-only home)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model.checkpoint import CACHE_ENV
from replay.cli.main import main


@pytest.mark.parametrize("under", ["", "sub"])
def test_an_unusable_model_cache_is_one_line(tmp_path: Path, under: str,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The demo makes the tiny model in the cache on first use: with the cache a file (or a
    path under one) it ended in a ``NotADirectoryError`` traceback, exit 1. Now one line naming
    the directory and the variable to set, exit 2, and no trace directory left behind."""
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("not a directory\n")
    monkeypatch.setenv(CACHE_ENV, str(blocker / under if under else blocker))
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(blocker) in err and f"${CACHE_ENV}" in err
    assert not out.exists()
