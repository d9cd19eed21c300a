"""A max_model_len past the checkpoint's max_position_embeddings is refused when the runner
starts, on CPU as on CUDA, in one ConfigError line (and `replayllm run` exits 2 with it). On CPU
it used to start, record, and stop mid-run with a ValueError traceback from ``check_batch`` at
the first sequence that grew past the model's positions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.config import Config
from engine.errors import ConfigError
from engine.model.checkpoint import default_model_dir
from engine.runner.model_runner import ModelRunner
from replay.cli.main import main

MAX_POSITIONS = 16


@pytest.fixture(scope="module")
def short_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint, declaring 16 positions."""
    path = Path(shutil.copytree(default_model_dir(), tmp_path_factory.mktemp("m") / "short"))
    cfg = json.loads((path / "config.json").read_text())
    cfg["max_position_embeddings"] = MAX_POSITIONS
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def runner(model: Path, max_model_len: int) -> ModelRunner:
    return ModelRunner(Config(
        model=str(model), device="cpu", kvcache_block_size=16, num_kvcache_blocks=8,
        max_model_len=max_model_len, max_num_batched_tokens=max(max_model_len, 64),
    ))  # fmt: skip


def test_a_max_model_len_past_the_models_positions_is_refused_at_start(short_model: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        runner(short_model, MAX_POSITIONS + 1)
    message = str(exc.value)
    assert "\n" not in message
    assert (f"max_model_len {MAX_POSITIONS + 1} exceeds the model's max_position_embeddings "
            f"{MAX_POSITIONS}") in message
    assert f"max_model_len <= {MAX_POSITIONS}" in message


def test_the_models_own_limit_is_accepted(short_model: Path) -> None:
    runner(short_model, MAX_POSITIONS).close()


def test_run_exits_2_with_one_line(
    short_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "w.jsonl"
    prompt = list(range(100, 112))
    workload.write_text(json.dumps({"prompt_token_ids": prompt, "max_tokens": 10}) + "\n")
    out = tmp_path / "trace"
    status = main(["run", "--model", str(short_model), "--workload", str(workload),
                   "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err[-1].startswith("replayllm run: error: max_model_len 4096 exceeds the model's "
                              f"max_position_embeddings {MAX_POSITIONS}")
    assert not any("Traceback" in line for line in err)


def test_an_eos_past_the_vocabulary_is_refused_at_start(short_model: Path) -> None:
    """``--set eos=N`` with N past the model's vocabulary names the vocabulary in one
    ConfigError line: it used to run with no token ever ending a request."""
    vocab = json.loads((short_model / "config.json").read_text())["vocab_size"]
    config = Config(model=str(short_model), device="cpu", kvcache_block_size=16,
                    num_kvcache_blocks=8, max_model_len=MAX_POSITIONS, eos=vocab)
    with pytest.raises(ConfigError) as exc:
        ModelRunner(config)
    message = str(exc.value)
    assert "\n" not in message
    assert f"eos {vocab} is no token of the model's vocabulary ({vocab} tokens" in message
    config = Config(model=str(short_model), device="cpu", kvcache_block_size=16,
                    num_kvcache_blocks=8, max_model_len=MAX_POSITIONS, eos=vocab - 1)
    ModelRunner(config).close()


def test_the_rotary_table_holds_max_model_len_positions_not_the_checkpoints(
    short_model: Path, tmp_path: Path
) -> None:
    """A checkpoint may declare 10^9 positions (a 1 TB cos/sin table, built before any
    check): the table holds the ``max_model_len`` positions a run can reach."""
    huge = Path(shutil.copytree(short_model, tmp_path / "huge"))
    cfg = json.loads((huge / "config.json").read_text())
    cfg["max_position_embeddings"] = 10**9
    (huge / "config.json").write_text(json.dumps(cfg))
    model_runner = runner(huge, 64)
    try:
        rotary = model_runner.model.model.layers[0].self_attn.rotary_emb
        assert rotary.cos_cache.shape[0] == 64
        assert model_runner.max_positions == 64
    finally:
        model_runner.close()
