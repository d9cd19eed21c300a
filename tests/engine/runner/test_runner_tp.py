"""Tensor parallelism end to end: an engine with two gloo ranks on CPU (rank 0 schedules and
broadcasts each step, a spawned worker runs the other shard) generates what TP=1 generates.

Marked slow: it spawns a process that imports torch and loads the tiny model.
"""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.errors import ConfigError
from engine.model.checkpoint import default_model_dir
from engine.runner.model_runner import ModelRunner

PROMPTS = [[11, 22, 33, 44, 55], list(range(300, 340)), [7] * 17]
CONFIG = {
    "device": "cpu",
    "dtype": "float32",
    "kvcache_block_size": 16,
    "num_kvcache_blocks": 64,
    "max_model_len": 256,
    "max_num_batched_tokens": 512,
}


def generate(tp_size: int) -> list[list[int]]:
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
    ]
    llm = LLM(str(default_model_dir()), tensor_parallel_size=tp_size, **CONFIG)
    try:
        info = llm.runner.describe()
        assert info["tensor_parallel_size"] == tp_size
        assert info.get("rank_devices", ["cpu"]) == ["cpu"] * tp_size
        return [out["token_ids"] for out in llm.generate(PROMPTS, params, use_tqdm=False)]
    finally:
        llm.close()


@pytest.mark.slow
def test_two_gloo_ranks_generate_what_one_rank_does() -> None:
    assert generate(2) == generate(1)


def test_tp_size_must_divide_the_heads() -> None:
    from engine.config import Config

    with pytest.raises(ConfigError, match="tensor_parallel_size 3 must divide"):
        ModelRunner(Config(model=str(default_model_dir()), tensor_parallel_size=3, **CONFIG))
