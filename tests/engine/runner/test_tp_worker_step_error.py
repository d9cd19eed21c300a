"""A tensor-parallel worker whose step raises leaves its error for rank 0, which raises it in
one line naming the rank: rank 0 said only "died (exit code 1)" and the cause stayed in the
worker's stderr."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.config import Config
from engine.runner import model_runner, tp


class StepFails:
    """A worker's runner whose step raises (a device out of memory on this rank alone)."""

    closed = False

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def worker_loop(self) -> None:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\non rank 1")

    def close(self) -> None:
        StepFails.closed = True


def test_a_workers_step_error_reaches_rank_0_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_runner, "ModelRunner", StepFails)
    with pytest.raises(RuntimeError):
        model_runner.worker_main(Config(device="cpu"), 1, str(tmp_path))
    assert StepFails.closed
    exited = SimpleNamespace(exitcode=1, sentinel=None)
    error = tp.died_worker(str(tmp_path), [exited], wait_s=0.0)
    assert str(error) == ("tensor-parallel rank 1: CUDA out of memory. Tried to allocate "
                          "2.00 GiB on rank 1")
