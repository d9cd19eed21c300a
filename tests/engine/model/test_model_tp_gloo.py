"""Tensor parallelism with real collectives: two gloo ranks on CPU give TP=1's logits.

Marked slow: it spawns two processes (each imports torch and loads the tiny model).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch

from engine.model.attention_metadata import build_attention_metadata
from engine.model.checkpoint import default_model_dir
from engine.model.layers.attention import get_attention_backend
from engine.model.layers.parallel import ParallelGroup
from engine.model.loader import build_model

WORLD_SIZE = 2
BLOCK_SIZE = 16
PROMPT = list(range(1000, 1040))
TABLE = [3, 1, 6]
TOLERANCE = 1e-3  # all-reduce changes the summation order; logits reach ~50


def prefill_logits(model_dir: str, group: ParallelGroup) -> torch.Tensor:
    cpu = torch.device("cpu")
    model = build_model(model_dir, get_attention_backend("torch", cpu), cpu, torch.float32, group)
    layers = model.attention_layers
    cache = torch.zeros(
        2, len(layers), 8, BLOCK_SIZE, layers[0].num_kv_heads, model.spec.head_dim
    )
    for i, layer in enumerate(layers):
        layer.bind_kv_cache(cache[0, i], cache[1, i])
    n = len(PROMPT)
    positions, metadata = build_attention_metadata([n], [n], [TABLE], BLOCK_SIZE, 1)
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(PROMPT), positions, metadata))


def _rank_main(rank: int, model_dir: str, store: str, results: multiprocessing.Queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD_SIZE
    )
    try:
        logits = prefill_logits(model_dir, ParallelGroup(rank, WORLD_SIZE))
        results.put((rank, logits.numpy()))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tmp_path: Path) -> None:
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    model_dir = str(default_model_dir())
    reference = prefill_logits(model_dir, ParallelGroup())
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    store = str(tmp_path / "gloo_store")
    procs = [
        ctx.Process(target=_rank_main, args=(r, model_dir, store, results))
        for r in range(WORLD_SIZE)
    ]
    for proc in procs:
        proc.start()
    outputs = dict(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    for rank in range(WORLD_SIZE):
        error = (torch.from_numpy(outputs[rank]) - reference).abs().max().item()
        print(f"rank {rank}: max abs logit difference TP=2 vs TP=1: {error:.3e}")
        assert error < TOLERANCE
