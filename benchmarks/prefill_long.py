"""Long-context prefill attention: the engine's Triton kernel against SDPA, per tiling variant.

One prompt of ``q_len`` new tokens after ``cached`` tokens of context (Qwen3-0.6B attention
shapes, bf16, 256-token pages), keys read fresh (``paged=False``, what a first prefill without
a cache hit does) or through the block table (a prefix hit or a later chunk). The reference is
PyTorch's SDPA (flash, bf16, causal) over the whole context with K/V heads repeated, whose last
``q_len`` query rows are the prefill's; FLOPs count the causal triangle once. Run through
``python -m benchmarks.kernels --only prefill-long`` (module docstring there).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.gpu_timing import BLOCK_SIZE, DTYPE, HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, bench_ms

# Relative error against SDPA's bf16 flash kernel: both round P to bf16, in other orders.
LONG_TOLERANCE = 2e-2
# (block_rows, block_n, num_warps, num_stages) of the Triton kernel; block_rows counts query
# rows x GQA group.
LONG_VARIANTS = [
    (64, 64, 4, 2),  # the engine's default before session 6
    (128, 128, 8, 2),  # its long tiling for keys through the cache (sessions 6-16)
    (128, 128, 8, 3),
]
# The Triton kernel's long tilings once more with heaviest query tiles first (``heavy_first``;
# the other rows launch tiles in order): 128/128/8/3 was its fresh-keys tiling in sessions 6-16.
ORDER_VARIANTS = [(128, 128, 8, 3)]
# (block_m, block_n, num_warps, num_stages, heavy_first, pair_heads) of the TMA kernel
# (prefill_attention_tma.py; block_m counts tokens of one head). Session 17's sweeps also had
# 128/128/8/2-4, 128/64/4/3-4, 128/32/4/2, 256/64/8/2-3, 256/128/8/2 one head a program and
# 64/64/4/3, 64/128/4/2, 128/64/8/2, 128/128/8/2 in pairs: slower (docs/gpu-notes.md).
TMA_VARIANTS = [
    (128, 128, 8, 3, True, False),
    (128, 64, 4, 2, True, False),
    (128, 64, 8, 3, True, True),
    (64, 64, 4, 2, True, True),
]


def attention_flops(q_len: int, cached: int) -> float:
    """Matrix FLOPs of causal attention for one sequence (QK^T and PV, the triangle once)."""
    return 4.0 * NUM_HEADS * HEAD_DIM * (q_len * cached + q_len * (q_len + 1) / 2)


def long_inputs(q_len: int, cached: int, seed: int = 0) -> dict[str, Any]:
    """Random q/k/v for one sequence of ``cached + q_len`` tokens, K/V also in shuffled pages."""
    gen = torch.Generator(device="cuda").manual_seed(seed + q_len + cached)
    ctx = q_len + cached
    q_all = torch.randn(ctx, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE, generator=gen)
    k = torch.randn(ctx, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE, generator=gen)
    v = torch.randn(ctx, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE, generator=gen)
    blocks = -(-ctx // BLOCK_SIZE)
    order = torch.randperm(blocks + 4, device="cuda", generator=gen)[:blocks]
    shape = (blocks + 4, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.zeros(shape, device="cuda", dtype=DTYPE)
    v_cache = torch.zeros(shape, device="cuda", dtype=DTYPE)
    pad = blocks * BLOCK_SIZE - ctx
    k_cache[order] = F.pad(k, (0, 0, 0, 0, 0, pad)).view(blocks, BLOCK_SIZE, NUM_KV_HEADS, -1)
    v_cache[order] = F.pad(v, (0, 0, 0, 0, 0, pad)).view(blocks, BLOCK_SIZE, NUM_KV_HEADS, -1)
    return {
        "q_all": q_all, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache,
        "tables": order.to(torch.int32)[None, :].contiguous(),
        "lens": torch.tensor([ctx], dtype=torch.int32, device="cuda"),
        "cu": torch.tensor([0, q_len], dtype=torch.int32, device="cuda"),
    }


def sdpa_reference(inp: dict[str, Any], q_len: int) -> tuple[torch.Tensor, Any]:
    """SDPA's output for the last ``q_len`` queries, and a call that times SDPA itself."""
    group = NUM_HEADS // NUM_KV_HEADS
    qb = inp["q_all"].transpose(0, 1)[None]
    kb = inp["k"].repeat_interleave(group, 1).transpose(0, 1)[None]
    vb = inp["v"].repeat_interleave(group, 1).transpose(0, 1)[None]

    def call() -> torch.Tensor:
        return F.scaled_dot_product_attention(qb, kb, vb, is_causal=True)

    out = call()[0].transpose(0, 1)[-q_len:]
    return out.contiguous(), call


def prefill_call(inp: dict[str, Any], q_len: int, paged: bool, out: torch.Tensor,
                 route: str | None = None, tma: tuple[int, int, int, int, bool, bool]
                 | None = None, **tiling: int) -> Any:
    """A call of the engine's prefill attention on these inputs (``tiling``: the Triton
    kernel's keyword arguments; ``route`` None: the engine's choice of kernel; ``tma``: the TMA
    kernel with this tiling)."""
    from engine.model.kernels.prefill_attention import prefill_attention
    from engine.model.kernels.prefill_attention_tma import tma_prefill_attention

    q = inp["q_all"][-q_len:]
    cache = ({"k_cache": inp["k_cache"], "v_cache": inp["v_cache"],
              "block_tables": inp["tables"]} if paged else {})
    k, v = inp["k"][-q_len:], inp["v"][-q_len:]

    def call() -> torch.Tensor:
        if tma is not None:
            return tma_prefill_attention(q, k, v, inp["cu"], inp["lens"], q_len,
                                         HEAD_DIM**-0.5, out, **cache, tiling=tma)
        return prefill_attention(q, k, v, inp["cu"], inp["lens"], q_len, HEAD_DIM**-0.5,
                                 out=out, route=route, **cache, **tiling)

    return call


def run_prefill_long(cases: list[tuple[int, int]], variants: list[tuple[int, int, int, int]]
                     | None = None) -> list[dict[str, Any]]:
    """Rows of (case, tiling, ms, TFLOP/s, error) for every case ``(q_len, cached)``."""
    rows = []
    for q_len, cached in cases:
        inp = long_inputs(q_len, cached)
        ref, sdpa = sdpa_reference(inp, q_len)
        flops = attention_flops(q_len, cached)
        label = f"prefill-long {q_len}+{cached}"
        ms = bench_ms(sdpa)
        rows.append({"case": label + " sdpa-flash", "ms": ms, "tflop_s": flops / ms / 1e9,
                     "rel_err": 0.0, "ok": True})
        for paged in ([False, True] if cached == 0 else [True]):
            choices: list[dict[str, Any]] = [{"engine_default": 1}]
            choices += [{"block_rows": r, "block_n": n, "num_warps": w, "num_stages": s,
                         "heavy_first": heavy}
                        for heavy in (False, True)
                        for r, n, w, s in (variants or LONG_VARIANTS) if not heavy
                        or (r, n, w, s) in ([] if variants else ORDER_VARIANTS)]
            choices += [{"tma": t} for t in ([] if variants else TMA_VARIANTS)]
            for tiling in choices:
                out = torch.full_like(inp["q_all"][-q_len:], float("nan"))
                kernel_args = {k: v for k, v in tiling.items() if k not in ("engine_default",
                                                                             "tma")}
                route = None if "engine_default" in tiling or "tma" in tiling else "triton"
                call = prefill_call(inp, q_len, paged, out, route, tiling.get("tma"),
                                    **kernel_args)
                try:
                    call()
                    torch.cuda.synchronize()
                except Exception as exc:  # a tiling the compiler refuses (shared memory)
                    rows.append({"case": label, **tiling, "ms": float("nan"), "tflop_s": 0.0,
                                 "rel_err": float("nan"), "ok": True, "error": str(exc)[:200]})
                    continue
                err = float((out.float() - ref.float()).norm() / ref.float().norm())
                ms = bench_ms(call)
                rows.append({"case": label + (" paged" if paged else " fresh"), **tiling,
                             "ms": ms, "tflop_s": flops / ms / 1e9, "rel_err": err,
                             "ok": err < LONG_TOLERANCE})
        del inp, ref
        torch.cuda.empty_cache()
    return rows
