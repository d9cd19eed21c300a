"""Tensor parallelism on CPU (gloo) when a rank fails: the group never outlives a failed
start-up or a dead worker, and every failure is one line, at once.

- a start-up that fails (a misshapen checkpoint) removed nothing: the process group stayed
  initialized, the store directory stayed in /tmp, and the next TP engine of the same process
  failed with "trying to initialize the default process group twice!";
- a worker that exits before joining (the script that re-runs its top level in every spawned
  worker, without `if __name__ == '__main__':`) left rank 0 waiting for the rendezvous for ten
  minutes;
- a worker's own start-up error reaches rank 0 and is raised there in one line;
- ``close()`` after a worker died raised gloo's "Connection closed by peer" traceback and left
  the group and the store behind.

Marked slow: each case spawns a worker process that imports torch.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.config import Config
from engine.errors import ConfigError, ModelLoadError, ReplayLLMError
from engine.model.checkpoint import default_model_dir
from engine.runner import tp

CONFIG = {"device": "cpu", "kvcache_block_size": 16, "num_kvcache_blocks": 32,
          "max_model_len": 128, "max_num_batched_tokens": 256, "tensor_parallel_size": 2}
PROMPT = [11, 22, 33, 44, 55]
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
REPO = Path(__file__).resolve().parents[3]


def store_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "replayllm-tp-*")))


def exit_at_once(config: Config, rank: int, store_dir: str) -> None:
    """A worker that dies before joining (as one re-running an unguarded script does)."""
    os._exit(3)


def fail_with_an_error(config: Config, rank: int, store_dir: str) -> None:
    """A worker whose start-up fails with an engine error, reported for rank 0."""
    tp.report_failure(store_dir, rank, ConfigError("shard 1 does not fit\nits device"))
    os._exit(1)


@pytest.mark.slow
def test_a_failed_start_up_leaves_nothing_and_the_next_engine_starts(tmp_path: Path) -> None:
    bad = Path(shutil.copytree(default_model_dir(), tmp_path / "bad"))
    tensors = load_file(str(bad / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = tensors[name][:, :100].contiguous()
    save_file(tensors, str(bad / "model.safetensors"))
    before = store_dirs()
    with pytest.raises(ModelLoadError, match="shape mismatch"):
        LLM(str(bad), record_events=False, **CONFIG)
    assert not dist.is_initialized()
    assert store_dirs() == before
    llm = LLM(str(default_model_dir()), record_events=False, **CONFIG)
    try:
        assert len(llm.generate([PROMPT], GREEDY, use_tqdm=False)[0]["token_ids"]) == 4
    finally:
        llm.close()
    assert not dist.is_initialized()
    assert store_dirs() == before


@pytest.mark.slow
def test_a_worker_that_exits_before_joining_is_named_at_once() -> None:
    before = store_dirs()
    config = Config(model=str(default_model_dir()), **CONFIG)
    raised: list[BaseException] = []

    def start() -> None:
        try:
            tp.start(config, torch.device("cpu"), exit_at_once)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            raised.append(exc)

    thread = threading.Thread(target=start, daemon=True)  # it hung ten minutes before the fix
    thread.start()
    thread.join(90)
    assert not thread.is_alive(), "rank 0 is still waiting for a worker that exited"
    assert len(raised) == 1 and isinstance(raised[0], ReplayLLMError)
    message = str(raised[0])
    assert message.startswith("tensor-parallel worker rank 1 exited (exit code 3) before joining")
    assert "if __name__ == '__main__':" in message
    assert not dist.is_initialized()
    assert store_dirs() == before


@pytest.mark.slow
def test_a_workers_start_up_error_is_raised_on_rank_0_in_one_line() -> None:
    config = Config(model=str(default_model_dir()), **CONFIG)
    with pytest.raises(ReplayLLMError) as exc:
        tp.start(config, torch.device("cpu"), fail_with_an_error)
    assert str(exc.value) == "tensor-parallel rank 1: shard 1 does not fit its device"
    assert not dist.is_initialized()


@pytest.mark.slow
def test_an_unguarded_script_fails_in_seconds_not_at_the_rendezvous_timeout(
    tmp_path: Path,
) -> None:
    """The whole user story: a script with no main guard (run by path, so spawn re-runs it)."""
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        from engine import LLM
        LLM({str(default_model_dir())!r}, record_events=False, **{CONFIG!r})
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("engine.errors.ReplayLLMError: tensor-parallel worker rank 1 exited")
    # The worker re-running the script is told why, in one line.
    assert "start the engine under `if __name__ == '__main__':`" in done.stderr


@pytest.mark.slow
def test_close_after_a_worker_died_cleans_up_without_raising() -> None:
    before = store_dirs()
    llm = LLM(str(default_model_dir()), record_events=False, **CONFIG)
    worker = llm.runner.dist.workers[0]
    os.kill(worker.pid, signal.SIGKILL)
    worker.join()
    with pytest.raises(RuntimeError):  # the step cannot run without the other shard
        llm.generate([PROMPT], GREEDY, use_tqdm=False)
    llm.close()
    assert not dist.is_initialized()
    assert store_dirs() == before
