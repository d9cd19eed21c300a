"""Tensor parallelism on CPU (gloo) when a rank dies after the group formed: one line naming
the rank and how it ended, never gloo's multi-line error.

- a worker SIGKILLed mid-run made rank 0's next step raise gloo's "Connection reset by peer
  ... GLHF!" RuntimeError (through ``replayllm run``: a traceback); now a
  ``WorkerDiedError`` (a ``ReplayLLMError``, so the CLI prints it as one line with exit 2);
- a worker whose rank 0 died printed gloo's traceback; now it exits with one line;
- a worker that dies after joining is no longer told to add an ``if __name__`` guard (that
  hint is for one that exits before joining);
- ``failed_worker`` reads a worker's error file once (it checked it, then read it again).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine import LLM, SamplingParams
from engine.errors import ReplayLLMError
from engine.model.checkpoint import default_model_dir
from engine.model.layers.parallel import ParallelGroup
from engine.runner import tp

CONFIG = {"device": "cpu", "kvcache_block_size": 16, "num_kvcache_blocks": 32,
          "max_model_len": 128, "max_num_batched_tokens": 256, "tensor_parallel_size": 2}


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_named_in_one_line() -> None:
    llm = LLM(str(default_model_dir()), record_events=False, **CONFIG)
    try:
        worker = llm.runner.dist.workers[0]
        os.kill(worker.pid, signal.SIGKILL)
        worker.join()
        with pytest.raises(tp.WorkerDiedError) as exc:
            llm.generate([[11, 22, 33]], SamplingParams(temperature=0.0, max_tokens=4),
                         use_tqdm=False)
    finally:
        llm.close()
    assert isinstance(exc.value, ReplayLLMError)
    assert str(exc.value) == ("tensor-parallel worker rank 1 died (killed by SIGKILL): the "
                              "engine cannot run a step without its shard")


READY = os.open(os.devnull, os.O_RDONLY)  # a sentinel that is ready at once: wait() returns


class FakeProc:
    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode
        self.sentinel = READY


def test_a_collective_that_fails_names_the_dead_worker_and_how_it_ended() -> None:
    group = tp.WatchedGroup(0, 3, None, "", [FakeProc(None), FakeProc(3)])
    with pytest.raises(tp.WorkerDiedError, match=r"^tensor-parallel worker rank 2 died "
                       r"\(exit code 3\): the engine cannot run a step without its shard$"):
        group.raise_if_died()
    assert tp.died_worker("", [FakeProc(None)], wait_s=0.01) is None  # no death: not named


def test_a_worker_whose_rank_0_died_exits_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = SimpleNamespace(pid=4321, join=lambda timeout: None, is_alive=lambda: False)
    monkeypatch.setattr(tp.multiprocessing, "parent_process", lambda: parent)
    with pytest.raises(SystemExit) as exc:
        tp.WatchedGroup(1, 2, None).raise_if_died()
    assert exc.value.code == "tensor-parallel rank 1: rank 0 (process 4321) died; this worker exits"


def test_a_worker_dead_after_joining_gets_no_main_guard_hint(tmp_path: Path) -> None:
    state = tp.Distributed(ParallelGroup(0, 2, None), None, str(tmp_path), [FakeProc(-9)])
    error = tp.failed_worker(state)
    assert str(error) == ("tensor-parallel worker rank 1 died (killed by SIGKILL): the engine "
                          "cannot run a step without its shard")


def test_failed_worker_reads_the_error_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tp.report_failure(str(tmp_path), 1, ValueError("shard 1\nbroke"))
    touched: list[str] = []
    for name in ("read_text", "is_file", "exists", "stat"):
        real = getattr(Path, name)

        def spy(self: Path, *args: object, _real: object = real, _name: str = name,
                **kwargs: object) -> object:
            if self.name.startswith("error-rank"):
                touched.append(_name)
            return _real(self, *args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(Path, name, spy)
    state = tp.Distributed(ParallelGroup(0, 2, None), None, str(tmp_path), [FakeProc(1)])
    assert str(tp.failed_worker(state)) == "tensor-parallel rank 1: shard 1 broke"
    assert touched == ["read_text"]
