"""A prefill over the CUDA-graph buffers computes what the eager prefill computes.

The tiny model runs one batch (a prefill with a prefix-cache hit and a fresh one) twice with the
Triton backend: over ``PrefillGraphs``' padded buffers (padded tokens, padding sequences, keys
read through the block table) and eagerly from ``build_attention_metadata``. The real rows'
logits must agree, and so must the KV caches: padding rows store nothing. This is the forward a
graph captures; capture and replay themselves run on the GPU (``test_gpu_runner.py``). Compiled
on CUDA, in Triton's interpreter on CPU; skipped without triton.
"""

from __future__ import annotations

import torch
from triton_env import DEVICE, load_attention_backend_module, tiny_model_with_cache

attention_triton = load_attention_backend_module()

from engine.config import Config  # noqa: E402
from engine.graph_sizes import prefill_graph_sizes  # noqa: E402
from engine.model.attention_metadata import build_attention_metadata  # noqa: E402
from engine.runner.prefill_graphs import PrefillGraphs  # noqa: E402

BLOCK_SIZE = 8
NUM_BLOCKS = 24
TABLE_WIDTH = 6
REL_TOL = 1e-4


def test_padded_graph_buffers_match_the_eager_prefill() -> None:
    gen = torch.Generator().manual_seed(1)
    prompt_a = torch.randint(0, 150000, (20,), generator=gen).tolist()
    prompt_b = torch.randint(0, 150000, (13,), generator=gen).tolist()
    tables = [[5, 2, 9], [1, 7]]
    results = []
    for padded in (False, True):
        model, cache = tiny_model_with_cache(attention_triton.TritonAttentionBackend(),
                                             BLOCK_SIZE, NUM_BLOCKS)
        with torch.no_grad():
            # Sequence a's first 16 tokens are cached (a prefix hit): written by an eager step.
            positions, md = build_attention_metadata([16], [16], [tables[0]], BLOCK_SIZE, 1,
                                                     DEVICE)
            model(torch.tensor(prompt_a[:16], device=DEVICE), positions, md)
            query, context = [4, 13], [20, 13]
            ids = prompt_a[16:] + prompt_b
            if padded:
                sizes = prefill_graph_sizes(64)
                # The default graph slots: 62 of 64 empty, as in a real graph's replay.
                graphs = PrefillGraphs(sizes, TABLE_WIDTH, BLOCK_SIZE, model.spec.hidden_size,
                                       torch.float32, torch.device(DEVICE),
                                       Config().prefill_graph_seqs)
                size = graphs.padded_size(len(ids), len(query))
                assert size == 32  # 17 tokens pad to 32
                graphs.stage(ids, query, context, tables, size)
                hidden = model(graphs.dev_i64[0, :size], graphs.dev_i64[1, :size],
                               graphs.metadata(size))[: len(ids)]
            else:
                positions, md = build_attention_metadata(query, context, tables, BLOCK_SIZE, 2,
                                                         DEVICE)
                hidden = model(torch.tensor(ids, device=DEVICE), positions, md)
            results.append((model.compute_logits(hidden).cpu(), cache.cpu()))
    (eager_logits, eager_cache), (graph_logits, graph_cache) = results
    assert not torch.isnan(graph_logits).any()
    assert float((graph_logits - eager_logits).norm() / eager_logits.norm()) < REL_TOL
    assert float((graph_cache - eager_cache).norm() / eager_cache.norm()) < REL_TOL


def test_mixed_graph_buffers_match_the_eager_mixed_step() -> None:
    """A mixed step (a chunk after cached context, a fresh prompt, two decodes) over
    ``MixedGraphs``' padded buffers computes the eager step's logits and KV cache."""
    from engine.runner.mixed_graphs import MixedGraphs, graph_rows

    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 150000, (n,), generator=gen).tolist() for n in (20, 13, 9, 12)]
    tables = [[5, 2, 9], [1, 7], [3, 4], [11, 12]]
    results = []
    for padded in (False, True):
        model, cache = tiny_model_with_cache(attention_triton.TritonAttentionBackend(),
                                             BLOCK_SIZE, NUM_BLOCKS)
        with torch.no_grad():
            # Cached before the step: a's first 16 tokens, c's and d's all but their last.
            done = [16, 0, 8, 11]
            for seq in (0, 2, 3):
                positions, md = build_attention_metadata([done[seq]], [done[seq]], [tables[seq]],
                                                         BLOCK_SIZE, 1, DEVICE)
                model(torch.tensor(prompts[seq][: done[seq]], device=DEVICE), positions, md)
            query, context = [4, 13, 1, 1], [20, 13, 9, 12]
            ids = prompts[0][16:] + prompts[1] + [prompts[2][-1], prompts[3][-1]]
            if padded:
                graphs = MixedGraphs(prefill_graph_sizes(64), [32], TABLE_WIDTH, BLOCK_SIZE,
                                     model.spec.hidden_size, torch.float32, torch.device(DEVICE))
                key = graphs.key(17, 2, 2)
                assert key == (32, 32)
                graphs.stage(ids, query, context, tables, 2, key)
                rows = graphs.rows(key)
                hidden = model(graphs.dev_i64[0, :rows], graphs.dev_i64[1, :rows],
                               graphs.metadata(key))
                hidden = hidden[torch.tensor(graph_rows(range(len(ids)), 17, 32), device=DEVICE)]
            else:
                positions, md = build_attention_metadata(query, context, tables, BLOCK_SIZE, 2,
                                                         DEVICE)
                hidden = model(torch.tensor(ids, device=DEVICE), positions, md)
            results.append((model.compute_logits(hidden).cpu(), cache.cpu()))
    (eager_logits, eager_cache), (graph_logits, graph_cache) = results
    assert not torch.isnan(graph_logits).any()
    assert float((graph_logits - eager_logits).norm() / eager_logits.norm()) < REL_TOL
    assert float((graph_cache - eager_cache).norm() / eager_cache.norm()) < REL_TOL
