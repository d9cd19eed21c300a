"""The prefill attention kernels at long contexts against PyTorch's SDPA, on the GPU.

One prompt of 1k to 32k new tokens, with and without a cached prefix (keys read fresh, and
through shuffled cache pages), in bf16 through every kernel route (``long_prefill.ROUTES``:
the engine's default choice, the Triton kernel, the Hopper TMA kernel where the device has it,
and for fresh keys flash SDPA): the output must match SDPA's causal flash attention over the
whole context within bf16 rounding, and every output row must be written. A batch of prompts of
mixed lengths (sequence boundaries inside key and query tiles, cached prefixes not a multiple of
a tile) must give the TMA kernel the Triton kernel's output. Compiled kernels only: skipped
without CUDA (the Triton interpreter tests of ``test_triton_kernels.py`` cover the arithmetic at
small sizes on the CPU).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CASES = [(1024, 0), (4096, 0), (8192, 0), (32768, 0), (1024, 3072), (2048, 14336),
         (4096, 28672)]


def _hopper() -> bool:
    return torch.cuda.get_device_capability()[0] >= 9


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize(("q_len", "cached"), CASES, ids=[f"{q}+{c}" for q, c in CASES])
def test_long_prefill_matches_sdpa(q_len: int, cached: int) -> None:
    from benchmarks.prefill_long import LONG_TOLERANCE, long_inputs, prefill_call, sdpa_reference

    inp = long_inputs(q_len, cached, seed=7)
    ref, _ = sdpa_reference(inp, q_len)
    routes: list[str | None] = [None, "triton"] + (["tma"] if _hopper() else [])
    cases = [(paged, route) for paged in ([False, True] if cached == 0 else [True])
             for route in routes]
    cases += [(False, "flash_sdpa")] if cached == 0 else []
    for paged, route in cases:
        out = torch.full_like(ref, float("nan"))
        prefill_call(inp, q_len, paged, out, route)()
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), ("every row must be written", paged, route)
        err = _rel_err(out, ref)
        assert err < LONG_TOLERANCE, (paged, route, err)


def test_tma_kernel_matches_triton_kernel_over_mixed_prompts() -> None:
    """Five prompts of 9k-100 new tokens (two with cached prefixes of 300 and 1,000 tokens)
    in one launch, keys fresh and through shuffled pages: the TMA kernel writes each prompt's
    rows as the Triton kernel does (within bf16 rounding of two summation orders)."""
    if not _hopper():
        pytest.skip("the TMA kernel needs compute capability 9+")
    from engine.model.kernels.prefill_attention import prefill_attention

    gen = torch.Generator(device="cuda").manual_seed(3)
    heads, kv_heads, dim, block = 16, 8, 128, 256
    q_lens, cached = [9000, 130, 4097, 100, 2500], [0, 300, 0, 1000, 0]
    tokens = sum(q_lens)
    q = torch.randn(tokens, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(tokens, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(tokens, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32,
                      device="cuda")
    ctx = [c + n for c, n in zip(cached, q_lens, strict=True)]
    pages = [-(-c // block) for c in ctx]
    width = max(pages)
    order = torch.randperm(sum(pages) + 3, device="cuda", generator=gen)
    k_cache = torch.randn(sum(pages) + 3, block, kv_heads, dim, device="cuda",
                          dtype=torch.bfloat16, generator=gen)
    v_cache = torch.randn_like(k_cache)
    tables = torch.zeros(len(q_lens), width, dtype=torch.int32, device="cuda")
    used = 0
    for s, (n, c) in enumerate(zip(q_lens, cached, strict=True)):
        tables[s, : pages[s]] = order[used : used + pages[s]].to(torch.int32)
        used += pages[s]
        # The new tokens' keys land in the cache after the cached prefix (as store_kv does).
        slots = torch.arange(c, c + n, device="cuda")
        phys = tables[s, slots // block].long() * block + slots % block
        row0 = int(cu[s])
        k_cache.view(-1, kv_heads, dim)[phys] = k[row0 : row0 + n]
        v_cache.view(-1, kv_heads, dim)[phys] = v[row0 : row0 + n]
    # Fresh keys: each prompt's context is the prompt alone.
    context = {True: torch.tensor(ctx, dtype=torch.int32, device="cuda"),
               False: torch.tensor(q_lens, dtype=torch.int32, device="cuda")}
    for paged in (True, False):
        cache = {"k_cache": k_cache, "v_cache": v_cache, "block_tables": tables} if paged else {}
        outs = {}
        for route in ("triton", "tma"):
            out = torch.full_like(q, float("nan"))
            prefill_attention(q, k, v, cu, context[paged], max(q_lens),
                              dim**-0.5, out=out, route=route, **cache)
            torch.cuda.synchronize()
            outs[route] = out
        assert not torch.isnan(outs["tma"]).any(), "every prompt row must be written"
        err = _rel_err(outs["tma"], outs["triton"])
        assert err < 1e-2, (paged, err)
