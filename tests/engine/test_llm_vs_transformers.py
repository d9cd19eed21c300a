"""The whole engine (``LLM.generate``: scheduler, prefix cache, preemption, paged KV) against
transformers' greedy ``generate`` on the tiny checkpoint in float32, token for token."""

from __future__ import annotations

import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.model.checkpoint import default_model_dir

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 32
BLOCK_SIZE = 16
ORDINARY_VOCAB = 151643  # ids below the special tokens
# 12 blocks of 16 tokens hold at most 192 tokens: the batch below needs ~330 at its peak.
SMALL_POOL_BLOCKS = 12


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(ORDINARY_VOCAB) for _ in range(length)]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    shared = _prompt(2 * BLOCK_SIZE, seed=1)
    return [
        _prompt(5, seed=2),
        shared + _prompt(9, seed=3),  # shares two full blocks with the next one
        shared + _prompt(30, seed=4),
        _prompt(47, seed=5),
        _prompt(64, seed=6),  # a multiple of the block size
    ]


@pytest.fixture(scope="module")
def expected(prompts: list[list[int]]) -> list[list[int]]:
    transformers.logging.set_verbosity_error()
    model = transformers.Qwen3ForCausalLM.from_pretrained(str(default_model_dir())).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
            outputs.append(out[0, len(prompt):].tolist())
    return outputs


@pytest.mark.parametrize("pool", [None, SMALL_POOL_BLOCKS], ids=["roomy", "preempting"])
def test_generate_matches_transformers_greedy(
    prompts: list[list[int]], expected: list[list[int]], pool: int | None
) -> None:
    """Batched greedy generation equals transformers' output for every prompt, with prefix-cache
    hits and, with the small pool, preemptions and recompute."""
    settings = {"num_kvcache_blocks": pool} if pool else {}
    llm = LLM(None, dtype="float32", kvcache_block_size=BLOCK_SIZE, max_model_len=256, **settings)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    preemptions = llm.core.scheduler.num_preemptions
    hits = len(llm.core.events.tables["block_hit"]["event_id"])
    llm.close()
    for prompt_index, (out, want) in enumerate(zip(outputs, expected)):
        assert out["token_ids"] == want, f"prompt {prompt_index} differs"
    assert hits > 0, "the shared prefix must be served from the cache"
    if pool:
        assert preemptions > 0, "the small pool must force preemptions"
