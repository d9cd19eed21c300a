"""ModelRunner as an executor: KV pool sizing, describe(), seeded sampling, batch checks, close."""

from __future__ import annotations

import pytest

from engine.batch import ScheduledBatch
from engine.config import Config
from engine.errors import ConfigError
from engine.model.checkpoint import PRESETS, default_model_dir
from engine.model.layers.sampler import Sampler
from engine.runner.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

BLOCK_SIZE = 16
TINY = PRESETS["tiny"]
FLOAT32_BYTES = 4


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(default_model_dir())


def make_runner(model_dir: str, **overrides: object) -> ModelRunner:
    settings: dict[str, object] = {
        "model": model_dir,
        "kvcache_block_size": BLOCK_SIZE,
        "num_kvcache_blocks": 32,
        "max_model_len": 256,
        "max_num_batched_tokens": 512,
    }
    settings.update(overrides)
    return ModelRunner(Config(**settings))


def prefill_batch(prompts: list[list[int]], temperature: float) -> ScheduledBatch:
    seqs = []
    for i, prompt in enumerate(prompts):
        seq = Sequence(i, prompt, SamplingParams(temperature=temperature, max_tokens=8))
        seq.block_table = [2 * i, 2 * i + 1]
        seqs.append(seq)
    lens = [len(p) for p in prompts]
    return ScheduledBatch(0, "prefill", seqs, lens, lens, num_prefill_seqs=len(seqs))


PROMPTS = [[11, 22, 33, 44, 55], [9] * 20, [123, 456, 789]]


def test_kv_pool_sized_from_bytes(model_dir: str) -> None:
    per_block = 2 * TINY.num_hidden_layers * BLOCK_SIZE * TINY.num_key_value_heads
    per_block *= TINY.head_dim * FLOAT32_BYTES
    runner = make_runner(model_dir, num_kvcache_blocks=-1, kv_cache_bytes=10 * per_block + 7)
    assert runner.num_kvcache_blocks == 10
    assert runner.kv_block_bytes == per_block
    assert tuple(runner.kv_cache.shape) == (
        2,
        TINY.num_hidden_layers,
        10,
        BLOCK_SIZE,
        TINY.num_key_value_heads,
        TINY.head_dim,
    )
    with pytest.raises(ConfigError, match="smaller than one block"):
        make_runner(model_dir, num_kvcache_blocks=-1, kv_cache_bytes=per_block - 1)


def test_describe_and_identity(model_dir: str) -> None:
    runner = make_runner(model_dir)
    info = runner.describe()
    assert info["device"] == "cpu" and info["dtype"] == "float32"
    assert info["attention_backend"] == "torch"
    assert info["num_kvcache_blocks"] == 32
    model = info["model"]
    assert model["architecture"] == "Qwen3ForCausalLM"
    assert (model["num_layers"], model["num_heads"], model["num_kv_heads"]) == (4, 4, 2)
    assert (model["head_dim"], model["hidden_size"], model["vocab_size"]) == (32, 64, 151936)
    assert model["num_params"] > 151936 * 64  # tied head counted once
    assert model["checkpoint_dtype"] == "float32" and model["dtype"] == "float32"
    assert info["sampler"] == "torch"  # the CPU sampler; on CUDA the GPU kernel's variant
    assert "rank_devices" not in info and "cuda_graphs" not in info  # one rank, no CUDA
    assert runner.cuda is None and not runner.fused_kernels
    assert runner.vocab_size == 151936 and runner.eos_token_id == 151643
    assert make_runner(model_dir, eos=151645).eos_token_id == 151645


def test_seeded_sampling_is_deterministic(model_dir: str) -> None:
    a, b = make_runner(model_dir, seed=7), make_runner(model_dir, seed=7)
    for _ in range(2):  # the same seed gives the same stream, step after step
        tokens = a.execute(prefill_batch(PROMPTS, 1.0)).token_ids
        assert tokens == b.execute(prefill_batch(PROMPTS, 1.0)).token_ids
        assert len(tokens) == len(PROMPTS)
    draws = set()
    for seed in range(4):
        a.sampler = Sampler(seed)
        draws.add(tuple(a.execute(prefill_batch(PROMPTS, 1.5)).token_ids))
    assert len(draws) > 1
    # Greedy ignores the generator, whatever state it is in.
    assert a.execute(prefill_batch(PROMPTS, 0.0)).token_ids == (
        b.execute(prefill_batch(PROMPTS, 0.0)).token_ids
    )


def test_unsampled_chunks_return_no_token(model_dir: str) -> None:
    runner = make_runner(model_dir)
    batch = prefill_batch(PROMPTS[:2], 0.0)
    batch.sample = [False, True]
    assert len(runner.execute(batch).token_ids) == 1
    batch = prefill_batch(PROMPTS[:1], 0.0)
    batch.sample = [False]
    assert runner.execute(batch).token_ids == []


def test_bad_batches_fail_loudly(model_dir: str) -> None:
    runner = make_runner(model_dir)
    batch = prefill_batch([[1] * 40], 0.0)  # 40 tokens in two 16-token blocks
    with pytest.raises(ValueError, match="cannot hold 40 tokens"):
        runner.execute(batch)
    batch = prefill_batch([[1] * 5], 0.0)
    batch.seqs[0].block_table = [99]
    with pytest.raises(ValueError, match="block id outside"):
        runner.execute(batch)
    batch = prefill_batch([[1] * 5], 0.0)
    batch.context_lens = [6]
    with pytest.raises(ValueError, match="<= tokens"):
        runner.execute(batch)


def test_backend_choice_and_close(model_dir: str) -> None:
    with pytest.raises(ConfigError, match="attention backend 'flash_attn' is not available"):
        make_runner(model_dir, attention_backend="flash_attn")
    # TP itself is tested in test_runner_tp.py; a size that cannot split the heads is refused.
    with pytest.raises(ConfigError, match="tensor_parallel_size 3 must divide"):
        make_runner(model_dir, tensor_parallel_size=3)
    runner = make_runner(model_dir, attention_backend="torch")
    runner.close()
    runner.close()
    with pytest.raises(RuntimeError, match="after close"):
        runner.execute(prefill_batch(PROMPTS[:1], 0.0))


def test_default_model_when_none_given() -> None:
    runner = ModelRunner(Config(num_kvcache_blocks=4))
    assert runner.model_dir == default_model_dir()
