"""Checkpoints for the loader tests to break (test_loader_errors, test_checkpoint_contents)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.model.checkpoint import make_model


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", tmp_path_factory.mktemp("pristine"))


@pytest.fixture()
def ckpt(pristine: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny checkpoint for a test to break."""
    return Path(shutil.copytree(pristine, tmp_path / "model"))
