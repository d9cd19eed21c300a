"""The TMA prefill kernel (``prefill_attention_tma``) against a float32 reference at tiny sizes.

Three prompts of mixed lengths in one launch, two with cached prefixes, keys fresh and through
shuffled cache pages, with tiles smaller than the prompts (sequence boundaries fall inside query
and key tiles, a cached prefix ends inside a key tile): every prompt row equals causal softmax
attention computed in float32 within float16 rounding, and no row is left unwritten. Runs in
Triton's interpreter on the CPU (where triton is installed) and compiled on Hopper GPUs; the
long-prompt checks against SDPA are ``test_prefill_attention_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from triton_env import HAS_CUDA, load_kernel_modules

(tma,) = load_kernel_modules("engine.model.kernels.prefill_attention_tma")

DEVICE = "cuda" if HAS_CUDA else "cpu"
HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 16, 32
Q_LENS, CACHED = [70, 5, 33], [0, 20, 40]
# (block_m, block_n, num_warps, num_stages, heavy_first, pair_heads): one head a program, and
# two heads of a KV group a program.
TINY_TILINGS = [(16, 16, 4, 2, True, False), (16, 16, 4, 2, False, True)]

if HAS_CUDA and torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("the TMA kernel needs compute capability 9+", allow_module_level=True)


def _inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    tokens, dt = sum(Q_LENS), torch.float16

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=DEVICE, dtype=dt)

    q, k, v = randn(tokens, HEADS, DIM), randn(tokens, KV_HEADS, DIM), randn(tokens, KV_HEADS, DIM)
    cu = torch.tensor([0, *torch.tensor(Q_LENS).cumsum(0).tolist()], dtype=torch.int32,
                      device=DEVICE)
    pages = [-(-(c + n) // BLOCK) for c, n in zip(CACHED, Q_LENS, strict=True)]
    k_cache, v_cache = randn(sum(pages) + 2, BLOCK, KV_HEADS, DIM), randn(sum(pages) + 2, BLOCK,
                                                                           KV_HEADS, DIM)
    order = torch.randperm(sum(pages) + 2, generator=gen, device=DEVICE).to(torch.int32)
    tables = torch.zeros(len(Q_LENS), max(pages), dtype=torch.int32, device=DEVICE)
    used = 0
    for s, (n, c) in enumerate(zip(Q_LENS, CACHED, strict=True)):
        tables[s, : pages[s]] = order[used : used + pages[s]]
        used += pages[s]
        slots = torch.arange(c, c + n, device=DEVICE)
        phys = tables[s, slots // BLOCK].long() * BLOCK + slots % BLOCK
        row0 = int(cu[s])
        k_cache.view(-1, KV_HEADS, DIM)[phys] = k[row0 : row0 + n]
        v_cache.view(-1, KV_HEADS, DIM)[phys] = v[row0 : row0 + n]
    return {"q": q, "k": k, "v": v, "cu": cu, "k_cache": k_cache, "v_cache": v_cache,
            "tables": tables}


def _reference(inp: dict[str, torch.Tensor], paged: bool) -> torch.Tensor:
    """Causal softmax attention per prompt in float32 (context: the cached prefix when paged)."""
    out = torch.zeros(inp["q"].shape, dtype=torch.float32, device=DEVICE)
    group = HEADS // KV_HEADS
    for s, (n, c) in enumerate(zip(Q_LENS, CACHED, strict=True)):
        row0, c = int(inp["cu"][s]), c if paged else 0
        if paged:
            pos = torch.arange(c + n, device=DEVICE)
            phys = inp["tables"][s, pos // BLOCK].long() * BLOCK + pos % BLOCK
            keys = inp["k_cache"].view(-1, KV_HEADS, DIM)[phys]
            values = inp["v_cache"].view(-1, KV_HEADS, DIM)[phys]
        else:
            keys, values = inp["k"][row0 : row0 + n], inp["v"][row0 : row0 + n]
        keys = keys.float().repeat_interleave(group, 1)
        values = values.float().repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", inp["q"][row0 : row0 + n].float(), keys) * DIM**-0.5
        visible = torch.arange(c + n, device=DEVICE)[None, :] <= (
            c + torch.arange(n, device=DEVICE))[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[row0 : row0 + n] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)
    return out


@pytest.mark.parametrize("tiling", TINY_TILINGS, ids=["one-head", "head-pairs"])
@pytest.mark.parametrize("paged", [True, False], ids=["through-pages", "fresh-keys"])
def test_tma_kernel_matches_float32_attention_over_mixed_prompts(
    paged: bool, tiling: tuple[int, int, int, int, bool, bool]
) -> None:
    inp = _inputs()
    context = [c + n for c, n in zip(CACHED, Q_LENS, strict=True)] if paged else Q_LENS
    out = torch.full_like(inp["q"], float("nan"))
    cache = ({"k_cache": inp["k_cache"], "v_cache": inp["v_cache"],
              "block_tables": inp["tables"]} if paged else {})
    tma.tma_prefill_attention(
        inp["q"], inp["k"], inp["v"], inp["cu"],
        torch.tensor(context, dtype=torch.int32, device=DEVICE), max(Q_LENS), DIM**-0.5, out,
        **cache, tiling=tiling,
    )  # fmt: skip
    if HAS_CUDA:
        torch.cuda.synchronize()
    assert not torch.isnan(out).any(), "every prompt row must be written"
    ref = _reference(inp, paged)
    assert float((out.float() - ref).norm() / ref.norm()) < 2e-3


def test_only_rectangular_views_and_whole_key_tiles_per_page_fit() -> None:
    """``tma_prefill_fits`` refuses what a descriptor cannot describe: CPU tensors, float32, a
    head size that is no power of two, a cache page that is not a whole number of key tiles."""
    inp = _inputs()
    q, k, v = inp["q"], inp["k"], inp["v"]
    if not HAS_CUDA:
        assert not tma.tma_prefill_fits(q, k, v, None, None, block_n=16)
        return
    assert tma.tma_prefill_fits(q, k, v, None, None, block_n=16)
    assert tma.tma_prefill_fits(q, k, v, inp["k_cache"], inp["v_cache"], block_n=16)
    assert not tma.tma_prefill_fits(q, k, v, inp["k_cache"], inp["v_cache"], block_n=64)
    assert not tma.tma_prefill_fits(q.float(), k.float(), v.float(), None, None, block_n=16)
    odd = torch.zeros(8, HEADS, 24, device=DEVICE, dtype=torch.float16)
    assert not tma.tma_prefill_fits(odd, odd[:, :KV_HEADS], odd[:, :KV_HEADS], None, None, 16)


def test_only_eager_launches_of_long_prompts_take_the_configured_kernel() -> None:
    """``long_prefill_route``: a CUDA graph's launch and prompts under ``LONG_PREFILL_TOKENS``
    keep the Triton kernel; a long eager launch takes ``Config.long_prefill_kernel`` where it
    fits (the TMA kernel: Hopper half precision; on the CPU it never does)."""
    from engine.model.kernels import launch
    from engine.model.kernels.long_prefill import LONG_PREFILL_TOKENS, long_prefill_route

    long = LONG_PREFILL_TOKENS
    q = torch.zeros(long, HEADS, 128, device=DEVICE, dtype=torch.float16)
    k = v = torch.zeros(long, KV_HEADS, 128, device=DEVICE, dtype=torch.float16)
    before = launch.long_prefill_kernel()
    try:
        launch.set_long_prefill_kernel("tma")
        assert long_prefill_route(q, k, v, 1, long - 1, None, None, False) == "triton"
        assert long_prefill_route(q, k, v, 1, long, None, None, True) == "triton"
        assert long_prefill_route(q, k, v, 1, long, None, None, False) == (
            "tma" if HAS_CUDA else "triton")
        launch.set_long_prefill_kernel("triton")
        assert long_prefill_route(q, k, v, 1, long, None, None, False) == "triton"
    finally:
        launch.set_long_prefill_kernel(before)
