"""The Triton attention backend against the PyTorch one inside the tiny model.

A mixed batch (a prefill with a prefix-cache hit, a fresh prefill, decodes) and a decode-only
batch go through the whole model with each backend; logits must agree. Runs compiled on CUDA or
in Triton's interpreter on CPU; skipped without triton.
"""

from __future__ import annotations

import torch
from triton_env import DEVICE, load_attention_backend_module, tiny_model_with_cache

attention_triton = load_attention_backend_module()

from engine.model.attention_metadata import build_attention_metadata  # noqa: E402
from engine.model.layers.attention_torch import TorchAttentionBackend  # noqa: E402

BLOCK_SIZE = 8
NUM_BLOCKS = 24
REL_TOL = 1e-4


def run_steps(backend: object) -> list[torch.Tensor]:
    device = torch.device(DEVICE)
    model, _ = tiny_model_with_cache(backend, BLOCK_SIZE, NUM_BLOCKS)
    gen = torch.Generator().manual_seed(0)
    prompt_a = torch.randint(0, 150000, (20,), generator=gen).tolist()
    prompt_b = torch.randint(0, 150000, (13,), generator=gen).tolist()
    tables = {"a": [5, 2, 9], "b": [1, 7], "c": [5, 2, 11, 3]}  # c shares a's first 2 blocks
    prompt_c = prompt_a[:16] + torch.randint(0, 150000, (6,), generator=gen).tolist()
    outputs = []

    def step(query_lens, context_lens, names, tokens, num_prefill):  # type: ignore[no-untyped-def]
        positions, md = build_attention_metadata(
            query_lens, context_lens, [tables[n] for n in names], BLOCK_SIZE, num_prefill, device
        )
        ids = torch.tensor(tokens, device=device)
        with torch.no_grad():
            outputs.append(model.compute_logits(model(ids, positions, md)).cpu())

    step([20, 13], [20, 13], ["a", "b"], prompt_a + prompt_b, 2)  # two fresh prefills
    # c hits a's first 16 tokens; a and b decode in the same batch.
    step([6, 1, 1], [22, 21, 14], ["c", "a", "b"], prompt_c[16:] + [77, 88], 1)
    step([1, 1, 1], [23, 22, 15], ["c", "a", "b"], [5, 6, 7], 0)  # decode only
    return outputs


def test_triton_backend_matches_torch_backend_in_the_model() -> None:
    ours = run_steps(attention_triton.TritonAttentionBackend())
    ref = run_steps(TorchAttentionBackend())
    for a, b in zip(ours, ref):
        assert not torch.isnan(a).any()
        assert float((a - b).norm() / b.norm()) < REL_TOL
