"""Split-K GEMMs for decode-sized batches (Triton): ``y = x W^T`` with few rows and small N.

At decode batch sizes the attention output and down projections (N = hidden size, 1,024 for
Qwen3-0.6B) have too few output tiles to fill the GPU: cuBLAS reads their weights at well
under 1 TB/s (docs/gpu-notes.md). Here the weight's rows are the MMA's M dimension (the
"swap AB" layout: a batch of 16-256 rows is the narrow side) and K is split over several
programs, so a 1,024-wide output still spreads over the whole machine. Each split writes a
float32 partial; the consumer sums the partials in a fixed order (deterministic, no atomics).
``fused.rms_norm_of_parts`` folds that sum into the residual add and RMSNorm that follow both
projections, so the split costs no extra launch.

``SILU_MUL``: the input is a ``[gate | up]`` row and the GEMM's operand is ``silu(gate) * up``,
computed as ``fused.silu_and_mul`` rounds it: the SwiGLU launch before ``down_proj`` goes too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from engine.model.kernels.fused import silu_mul_values
from engine.model.kernels.gdc import gdc_enter, prefetch_l2
from engine.model.kernels.launch import pdl_options

if TYPE_CHECKING:
    from engine.model.layers.decode_gemm import SplitKTiling

LINE = tl.constexpr(64)  # half-precision elements in a 128-byte cache line


@triton.jit
def _splitk_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    x_stride,
    N: tl.constexpr,
    K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    SILU_MUL: tl.constexpr,
    PREFETCH: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    k_span: tl.constexpr = K // SPLIT_K
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if PREFETCH and pid_m == 0:  # this program's weight slice, under the previous kernel's tail
        lines = w_ptr + cols.to(tl.int64)[:, None] * K + pid_s * k_span
        lines += (tl.arange(0, BLOCK_K // LINE) * LINE)[None, :]
        for _ in tl.range(0, k_span, BLOCK_K):
            prefetch_l2(lines)
            lines += BLOCK_K
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    ks = pid_s * k_span + tl.arange(0, BLOCK_K)
    row_ok = rows < M
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * x_stride + ks[None, :]
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * K + ks[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in tl.range(0, k_span, BLOCK_K, num_stages=STAGES):
        a = tl.load(x_ptrs, mask=row_ok[:, None], other=0.0)
        if SILU_MUL:  # x holds [gate | up]: the operand is silu(gate) * up, K wide
            a = silu_mul_values(a, tl.load(x_ptrs + K, mask=row_ok[:, None], other=0.0))
        w = tl.load(w_ptrs)
        acc = tl.dot(w, tl.trans(a), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_ptrs = out_ptr + pid_s * M * N + rows[None, :] * N + cols[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[None, :])


def splitk_linear(
    x: torch.Tensor, weight: torch.Tensor, tiling: SplitKTiling, silu_mul: bool = False
) -> torch.Tensor:
    """``x W^T`` for ``x`` ``[M, K]`` (``[M, 2K]`` laid out ``[gate | up]`` with ``silu_mul``)
    and ``weight`` ``[N, K]``.

    One split: ``[M, N]`` in ``x``'s dtype (float32 accumulation, rounded once, as cuBLAS
    does). Several: ``[split_k, M, N]`` float32 partials, to be summed in order by the consumer
    (``fused.rms_norm_of_parts``)."""
    n, k = weight.shape
    m = x.shape[0]
    if x.shape[-1] != (2 * k if silu_mul else k):
        raise ValueError(f"input width {x.shape[-1]} does not match the weight's {k}")
    if x.stride(-1) != 1 or not weight.is_contiguous():
        raise ValueError("splitk_linear needs row-major operands")
    if not tiling.fits(m, n, k):
        raise ValueError(f"tiling {tiling.label()} does not fit M={m} N={n} K={k}")
    split = tiling.split_k
    dtype = x.dtype if split == 1 else torch.float32
    out = torch.empty((split, m, n) if split > 1 else (m, n), dtype=dtype, device=x.device)
    if m:
        grid = (n // tiling.block_n, triton.cdiv(m, tiling.block_m), split)
        _splitk_kernel[grid](
            x,
            weight,
            out,
            m,
            x.stride(0),
            N=n,
            K=k,
            SPLIT_K=split,
            BLOCK_N=tiling.block_n,
            BLOCK_M=tiling.block_m,
            BLOCK_K=tiling.block_k,
            STAGES=tiling.num_stages,
            SILU_MUL=silu_mul,
            PREFETCH=tiling.prefetch,
            num_warps=tiling.num_warps,
            **pdl_options(),
        )
    return out
