"""The engine's Qwen3 on the tiny checkpoint against transformers' own implementation.

Logits must agree at every position, and greedy decoding driven through ``ModelRunner.execute``
(paged KV cache, shuffled block ids, batched decodes, shared prefix blocks, chunked prefill mixed
with decodes) must reproduce ``transformers`` ``generate`` token for token.
"""

from __future__ import annotations

import random

import pytest
import torch

from engine.batch import ScheduledBatch
from engine.config import Config
from engine.model.attention_metadata import build_attention_metadata
from engine.model.checkpoint import default_model_dir
from engine.runner.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

transformers = pytest.importorskip("transformers")

BLOCK_SIZE = 16
NUM_BLOCKS = 96
NEW_TOKENS = 32
# float32 on both sides; only summation order differs. Logits reach ~50, hence a relative term.
LOGIT_ATOL = 1e-4
LOGIT_RTOL = 1e-5
PROMPT_LENGTHS = (5, 17, 40, 63)
TOKENIZER_VOCAB = 151643  # ordinary BPE ids: prompts are drawn from these


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(default_model_dir())


@pytest.fixture(scope="module")
def hf_model(model_dir: str):
    transformers.logging.set_verbosity_error()
    # The tiny checkpoint is stored in float32, so every transformers version loads it as such
    # (the dtype keyword was renamed between 4.x and 5.x; leaving it out works with both).
    model = transformers.Qwen3ForCausalLM.from_pretrained(model_dir)
    assert model.dtype == torch.float32
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.fixture()
def runner(model_dir: str):
    config = Config(
        model=model_dir,
        kvcache_block_size=BLOCK_SIZE,
        num_kvcache_blocks=NUM_BLOCKS,
        max_model_len=512,
        max_num_batched_tokens=1024,
        dtype="float32",
        device="cpu",
    )
    runner = ModelRunner(config)
    yield runner
    runner.close()


def random_prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(TOKENIZER_VOCAB) for _ in range(length)]


def _prompts() -> dict[str, list[int]]:
    p = {f"batch{n}": random_prompt(n, seed=100 + n) for n in PROMPT_LENGTHS}
    p["same_step_a"] = random_prompt(40, seed=7)
    p["same_step_b"] = p["same_step_a"][: 2 * BLOCK_SIZE] + random_prompt(21, seed=8)
    p["earlier_a"] = random_prompt(63, seed=9)
    p["earlier_b"] = p["earlier_a"][: 3 * BLOCK_SIZE] + random_prompt(5, seed=10)
    for name, n in (("mixed_x", 17), ("mixed_y", 5), ("mixed_z", 40)):
        p[name] = random_prompt(n, seed=20 + n)
    return p


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def hf_greedy(hf_model) -> dict[str, list[int]]:
    """transformers' greedy continuation of every prompt, from one left-padded ``generate``."""
    names = list(PROMPTS)
    width = max(len(p) for p in PROMPTS.values())
    pad = hf_model.generation_config.pad_token_id
    ids = torch.tensor([[pad] * (width - len(PROMPTS[n])) + PROMPTS[n] for n in names])
    mask = torch.tensor([[0] * (width - len(PROMPTS[n])) + [1] * len(PROMPTS[n]) for n in names])
    with torch.no_grad():
        out = hf_model.generate(
            ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False
        )
    return {name: out[i, width:].tolist() for i, name in enumerate(names)}


class BlockPool:
    """Hands out block ids in a shuffled order, so block tables are far from contiguous."""

    def __init__(self, seed: int = 0) -> None:
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)

    def take(self, count: int) -> list[int]:
        taken, self.free = self.free[:count], self.free[count:]
        return taken


def new_seq(seq_id: int, prompt: list[int], blocks: list[int]) -> Sequence:
    seq = Sequence(seq_id, prompt, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))
    seq.block_table = blocks
    return seq


def blocks_for(num_tokens: int) -> int:
    return (num_tokens + BLOCK_SIZE - 1) // BLOCK_SIZE


def step(
    runner: ModelRunner,
    seqs: list[Sequence],
    new: list[int],
    num_prefill: int,
    sample: list[bool] | None = None,
    ctx: list[int] | None = None,
) -> None:
    """Run one step and append each sampled token to its sequence."""
    context_lens = ctx if ctx is not None else [len(s.token_ids) for s in seqs]
    kind = "decode" if num_prefill == 0 else ("prefill" if num_prefill == len(seqs) else "mixed")
    batch = ScheduledBatch(
        step=0,
        kind=kind,
        seqs=seqs,
        num_new_tokens=new,
        context_lens=context_lens,
        num_prefill_seqs=num_prefill,
        sample=sample,
    )
    out = runner.execute(batch)
    sampled = [s for i, s in enumerate(seqs) if sample is None or sample[i]]
    assert len(out.token_ids) == len(sampled)
    for seq, token in zip(sampled, out.token_ids):
        seq.append_token(token)


def decode_until(runner: ModelRunner, seqs: list[Sequence], new_tokens: int) -> None:
    while any(s.num_completion_tokens < new_tokens for s in seqs):
        active = [s for s in seqs if s.num_completion_tokens < new_tokens]
        step(runner, active, [1] * len(active), num_prefill=0)


def test_prefill_logits_match_at_every_position(runner: ModelRunner, hf_model) -> None:
    prompts = [PROMPTS[f"batch{n}"] for n in PROMPT_LENGTHS]
    pool = BlockPool(seed=1)
    tables = [pool.take(blocks_for(len(p))) for p in prompts]
    ids = torch.tensor([t for p in prompts for t in p])
    lens = [len(p) for p in prompts]
    positions, metadata = build_attention_metadata(lens, lens, tables, BLOCK_SIZE, len(prompts))
    with torch.no_grad():
        ours = runner.model.compute_logits(runner.model(ids, positions, metadata))
        worst, within = 0.0, True
        start = 0
        for prompt in prompts:
            reference = hf_model(torch.tensor([prompt])).logits[0]
            diff = (ours[start : start + len(prompt)] - reference).abs()
            worst = max(worst, diff.max().item())
            within &= bool((diff <= LOGIT_ATOL + LOGIT_RTOL * reference.abs()).all())
            start += len(prompt)
    print(f"max abs logit error vs transformers: {worst:.3e}")
    assert within, f"logits differ by up to {worst:.3e}"


def test_batched_greedy_generation_matches(runner: ModelRunner, hf_greedy) -> None:
    names = [f"batch{n}" for n in PROMPT_LENGTHS]
    prompts = [PROMPTS[name] for name in names]
    pool = BlockPool(seed=2)
    seqs = [
        new_seq(i, p, pool.take(blocks_for(len(p) + NEW_TOKENS))) for i, p in enumerate(prompts)
    ]
    step(runner, seqs, [len(p) for p in prompts], num_prefill=len(seqs))
    decode_until(runner, seqs, NEW_TOKENS)
    for seq, name in zip(seqs, names):
        assert seq.completion_token_ids == hf_greedy[name], name


def test_shared_prefix_written_in_the_same_step(runner: ModelRunner, hf_greedy) -> None:
    """B's first two blocks are A's; A computes them in the very step B reads them."""
    shared = 2 * BLOCK_SIZE
    a_prompt, b_prompt = PROMPTS["same_step_a"], PROMPTS["same_step_b"]
    pool = BlockPool(seed=3)
    a_blocks = pool.take(blocks_for(len(a_prompt) + NEW_TOKENS))
    b_blocks = a_blocks[:2] + pool.take(blocks_for(len(b_prompt) + NEW_TOKENS) - 2)
    a, b = new_seq(0, a_prompt, a_blocks), new_seq(1, b_prompt, b_blocks)
    # The reader comes first in the batch: every K/V of the batch is stored before attending.
    step(runner, [b, a], [len(b_prompt) - shared, len(a_prompt)], num_prefill=2)
    decode_until(runner, [a, b], NEW_TOKENS)
    assert a.completion_token_ids == hf_greedy["same_step_a"]
    assert b.completion_token_ids == hf_greedy["same_step_b"]


def test_prefix_cached_by_an_earlier_step(runner: ModelRunner, hf_greedy) -> None:
    """B prefills only its suffix (context_lens - num_new_tokens > 0) after A filled the prefix."""
    shared = 3 * BLOCK_SIZE
    a_prompt, b_prompt = PROMPTS["earlier_a"], PROMPTS["earlier_b"]
    pool = BlockPool(seed=4)
    a_blocks = pool.take(blocks_for(len(a_prompt) + NEW_TOKENS))
    b_blocks = a_blocks[:3] + pool.take(blocks_for(len(b_prompt) + NEW_TOKENS) - 3)
    a, b = new_seq(0, a_prompt, a_blocks), new_seq(1, b_prompt, b_blocks)
    step(runner, [a], [len(a_prompt)], num_prefill=1)
    step(runner, [a], [1], num_prefill=0)
    step(runner, [b], [len(b_prompt) - shared], num_prefill=1)
    decode_until(runner, [a, b], NEW_TOKENS)
    assert a.completion_token_ids == hf_greedy["earlier_a"]
    assert b.completion_token_ids == hf_greedy["earlier_b"]


def test_mixed_batch_chunked_prefill_with_decodes(runner: ModelRunner, hf_greedy) -> None:
    """A long prompt is prefilled in chunks, each in the same step as other sequences' decodes."""
    x_prompt, y_prompt, z_prompt = (PROMPTS[n] for n in ("mixed_x", "mixed_y", "mixed_z"))
    pool = BlockPool(seed=5)
    x, y, z = (
        new_seq(i, p, pool.take(blocks_for(len(p) + NEW_TOKENS)))
        for i, p in enumerate((x_prompt, y_prompt, z_prompt))
    )
    step(runner, [x, y], [len(x_prompt), len(y_prompt)], num_prefill=2)
    chunk = BLOCK_SIZE
    # Chunk 1 of z: no token sampled for it; x and y decode in the same step.
    step(
        runner,
        [z, x, y],
        [chunk, 1, 1],
        num_prefill=1,
        sample=[False, True, True],
        ctx=[chunk, len(x.token_ids), len(y.token_ids)],
    )
    # Last chunk of z: it samples its first token.
    step(runner, [z, x, y], [len(z_prompt) - chunk, 1, 1], num_prefill=1)
    decode_until(runner, [x, y, z], NEW_TOKENS)
    for seq, name in ((x, "mixed_x"), (y, "mixed_y"), (z, "mixed_z")):
        assert seq.completion_token_ids == hf_greedy[name], name
