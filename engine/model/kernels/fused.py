"""Fused elementwise kernels for the CUDA path (Triton): one launch where PyTorch needs many.

In eager PyTorch each RMSNorm and each RoPE is several tiny kernels; inside a CUDA graph each
launch still costs time, which for a decode step adds up to as much as the step's real work
(figures: docs/gpu-notes.md, "Where the numbers in the code went"). These kernels cut a layer to
a handful of launches:

- ``rms_norm``: optional residual add, then RMSNorm (one program per row);
- ``qk_norm_rope``: Qwen3's per-head RMSNorm of q and k followed by rotary embedding, reading
  the fused QKV projection output in place (one program per token, all its heads); optionally
  it also writes the rotated K and the V of each token to its paged-KV-cache slot, the work of
  ``triton_kv_store.store_kv`` without its launch;
- ``silu_and_mul``: SwiGLU's ``silu(gate) * up``.

Rounding follows Hugging Face's eager code where it rounds to the activation dtype: the residual
sum, the normalized value before the weight, the weighted value; statistics are float32. RoPE
is computed in float32 and rounded once (Hugging Face rounds after each of its three ops), a
difference of at most one bf16 rounding step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.model.kernels.gdc import gdc_enter
from engine.model.kernels.launch import pdl_options

ROW_NUM_WARPS = 4
SILU_BLOCK = 1024


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    x_stride,
    residual_stride,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PARTS: tl.constexpr,
    part_stride,
    USE_GDC: tl.constexpr,
):
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < HIDDEN
    dtype = out_ptr.dtype.element_ty
    if PARTS > 1:  # float32 split-K partials: summed in order, rounded once as a GEMM output
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for part in tl.static_range(PARTS):
            acc += tl.load(x_ptr + part * part_stride + row * x_stride + cols, mask=ok, other=0.0)
        x = acc.to(dtype)
    else:
        x = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        res = tl.load(residual_ptr + row * residual_stride + cols, mask=ok, other=0.0)
        # Round the sum to the activation dtype first, as a PyTorch add would.
        x = (x.to(tl.float32) + res.to(tl.float32)).to(dtype)
        tl.store(residual_out_ptr + row * HIDDEN + cols, x, mask=ok)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / HIDDEN + eps)
    normed = (xf * inv).to(dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * HIDDEN + cols, (normed * w).to(dtype), mask=ok)


def _launch_rms_norm(
    x: torch.Tensor,
    x_stride: int,
    residual: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    residual_out: torch.Tensor,
    eps: float,
    has_residual: bool,
    parts: int = 1,
    part_stride: int = 0,
) -> None:
    """One program per row of ``out`` (``[rows, hidden]``): ``_rms_norm_kernel`` over ``x``
    (``parts`` float32 partials ``part_stride`` apart, or one row-major tensor)."""
    rows, hidden = out.shape
    if rows:
        _rms_norm_kernel[(rows,)](
            x,
            residual,
            weight,
            out,
            residual_out,
            x_stride,
            residual.stride(0),
            eps,
            HIDDEN=hidden,
            BLOCK=triton.next_power_of_2(hidden),
            HAS_RESIDUAL=has_residual,
            PARTS=parts,
            part_stride=part_stride,
            num_warps=ROW_NUM_WARPS,
            **pdl_options(),
        )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``RMSNorm(x)`` or, with ``residual``, ``(RMSNorm(x + residual), x + residual)``."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], hidden, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else out
    res2 = residual.reshape(-1, hidden) if residual is not None else x2
    _launch_rms_norm(x2, x2.stride(0), res2, weight, out, res_out, eps, residual is not None)
    out = out.view(x.shape)
    if residual is None:
        return out
    return out, res_out.view(x.shape)


def rms_norm_of_parts(
    parts: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm(sum(parts), weight, eps, residual)`` for ``parts`` ``[S, rows, hidden]``
    float32 (a split-K GEMM's partials, ``skinny_gemm.splitk_linear``): the sum is taken in
    order and rounded to ``residual``'s dtype, as the unsplit GEMM's output would be."""
    splits, rows, hidden = parts.shape
    if not parts.is_contiguous() or parts.dtype != torch.float32:
        raise ValueError("rms_norm_of_parts needs contiguous float32 partials")
    res2 = residual.reshape(-1, hidden)
    if res2.shape[0] != rows:
        raise ValueError(f"{rows} partial rows against {res2.shape[0]} residual rows")
    out = torch.empty(rows, hidden, dtype=residual.dtype, device=parts.device)
    res_out = torch.empty_like(out)
    _launch_rms_norm(parts, hidden, res2, weight, out, res_out, eps, True, splits, rows * hidden)
    return out.view(residual.shape), res_out.view(residual.shape)


@triton.jit
def norm_rope_halves(x1, x2, w1, w2, cos, sin, eps, HEAD_DIM: tl.constexpr):
    """Qwen3's per-head RMSNorm, then NeoX RoPE, of rows given as their two halves.

    ``x1``/``x2`` ``[rows, half]`` in the activations' dtype; ``w1``/``w2`` the norm weight's
    halves in float32 (broadcastable to the rows); ``cos``/``sin`` ``[half]`` at the rows'
    position. Returns the rotated halves in ``x1``'s dtype. Shared by ``qk_norm_rope`` and the
    decode attention kernel that applies it to its own query and new key (paged_attention.py).
    """
    dtype = x1.dtype
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    inv = tl.rsqrt((tl.sum(a * a, 1) + tl.sum(b * b, 1)) / HEAD_DIM + eps)[:, None]
    # Hugging Face rounds after normalizing and after the weight; do the same.
    a = ((a * inv).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
    b = ((b * inv).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    cos = cos.to(dtype).to(tl.float32)[None, :]
    sin = sin.to(dtype).to(tl.float32)[None, :]
    return (a * cos - b * sin).to(dtype), (b * cos + a * sin).to(dtype)


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr,
    q_weight_ptr,
    k_weight_ptr,
    cos_ptr,
    sin_ptr,
    positions_ptr,
    q_out_ptr,
    k_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    qkv_stride,
    cos_stride,
    eps,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    STORE_KV: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    # One program per token: all its q and k heads (rows) at once, halves split for RoPE.
    token = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = HEAD_DIM // 2
    heads = tl.arange(0, HEADS_PAD)
    cols = tl.arange(0, HALF_PAD)
    is_q = heads < NUM_HEADS
    head_ok = heads < NUM_HEADS + NUM_KV_HEADS
    ok = head_ok[:, None] & (cols < half)[None, :]
    src = qkv_ptr + token * qkv_stride + heads[:, None] * HEAD_DIM + cols[None, :]
    x1 = tl.load(src, mask=ok, other=0.0)
    x2 = tl.load(src + half, mask=ok, other=0.0)
    q_rows = is_q[:, None] & ok
    k_rows = (~is_q)[:, None] & ok
    w1 = tl.load(q_weight_ptr + cols[None, :], mask=q_rows, other=0.0).to(tl.float32)
    w1 += tl.load(k_weight_ptr + cols[None, :], mask=k_rows, other=0.0).to(tl.float32)
    w2 = tl.load(q_weight_ptr + half + cols[None, :], mask=q_rows, other=0.0).to(tl.float32)
    w2 += tl.load(k_weight_ptr + half + cols[None, :], mask=k_rows, other=0.0).to(tl.float32)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    col_ok = cols < half
    cos = tl.load(cos_ptr + pos * cos_stride + cols, mask=col_ok, other=0.0)
    sin = tl.load(sin_ptr + pos * cos_stride + cols, mask=col_ok, other=0.0)
    out1, out2 = norm_rope_halves(x1, x2, w1, w2, cos, sin, eps, HEAD_DIM)
    q_dst = q_out_ptr + (token * NUM_HEADS + heads[:, None]) * HEAD_DIM + cols[None, :]
    k_head = tl.where(is_q, 0, heads - NUM_HEADS)
    k_dst = k_out_ptr + (token * NUM_KV_HEADS + k_head[:, None]) * HEAD_DIM + cols[None, :]
    tl.store(q_dst, out1, mask=q_rows)
    tl.store(q_dst + half, out2, mask=q_rows)
    tl.store(k_dst, out1, mask=k_rows)
    tl.store(k_dst + half, out2, mask=k_rows)
    if STORE_KV:
        # The cache viewed as [slots, NUM_KV_HEADS * HEAD_DIM], as store_kv writes it; slot -1
        # (a padding token) writes nothing. int64: slot * row width overflows int32.
        slot = tl.load(slot_ptr + token).to(tl.int64)
        live = k_rows & (slot >= 0)
        cache_off = slot * (NUM_KV_HEADS * HEAD_DIM) + k_head[:, None] * HEAD_DIM + cols[None, :]
        cache_ty = k_cache_ptr.dtype.element_ty
        tl.store(k_cache_ptr + cache_off, out1.to(cache_ty), mask=live)
        tl.store(k_cache_ptr + cache_off + half, out2.to(cache_ty), mask=live)
        # V: the k rows' heads, shifted past the k block of the QKV row, copied unchanged.
        v_src = qkv_ptr + token * qkv_stride + (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM
        v_src += k_head[:, None] * HEAD_DIM + cols[None, :]
        v1 = tl.load(v_src, mask=live, other=0.0)
        v2 = tl.load(v_src + half, mask=live, other=0.0)
        tl.store(v_cache_ptr + cache_off, v1.to(v_cache_ptr.dtype.element_ty), mask=live)
        tl.store(v_cache_ptr + cache_off + half, v2.to(v_cache_ptr.dtype.element_ty), mask=live)


def qk_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split ``qkv`` ``[tokens, (H + 2 KvH) * D]``; return normed, rotated ``q``, ``k`` and ``v``.

    ``cos_cache``/``sin_cache`` ``[max_pos, D]`` hold the NeoX layout (both halves equal), as
    :class:`~engine.model.layers.rotary_embedding.RotaryEmbedding` builds them. ``v`` is a view.

    With ``k_cache``/``v_cache`` (contiguous, ``[num_blocks, block_size, KvH, D]``) and
    ``slot_mapping`` (``[tokens]``, ``-1``: skip), each token's rotated K and its V are also
    written to its cache slot, exactly what ``triton_kv_store.store_kv(k, v, ...)`` would write.
    """
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
    if qkv.stride(-1) != 1:
        raise ValueError("qkv must be contiguous in its last dimension")
    tokens = qkv.shape[0]
    store = k_cache is not None
    if store:
        if v_cache is None or slot_mapping is None:
            raise ValueError("a fused KV store needs k_cache, v_cache and slot_mapping")
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("the KV caches must be contiguous")
        for cache in (k_cache, v_cache):
            if tuple(cache.shape[2:]) != (num_kv_heads, head_dim):
                raise ValueError(
                    f"cache rows {tuple(cache.shape[2:])} do not match {(num_kv_heads, head_dim)}"
                )
        if slot_mapping.shape != (tokens,):
            raise ValueError(f"slot_mapping has shape {tuple(slot_mapping.shape)}, need {tokens}")
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(tokens, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    v = qkv[:, q_size + kv_size :].view(tokens, num_kv_heads, head_dim)
    if tokens:
        _qk_norm_rope_kernel[(tokens,)](
            qkv,
            q_weight,
            k_weight,
            cos_cache,
            sin_cache,
            positions,
            q,
            k,
            k_cache if store else k,  # unused without STORE_KV
            v_cache if store else k,
            slot_mapping if store else positions,
            qkv.stride(0),
            cos_cache.stride(0),
            eps,
            NUM_HEADS=num_heads,
            NUM_KV_HEADS=num_kv_heads,
            HEADS_PAD=triton.next_power_of_2(num_heads + num_kv_heads),
            HEAD_DIM=head_dim,
            HALF_PAD=triton.next_power_of_2(head_dim // 2),
            STORE_KV=store,
            num_warps=ROW_NUM_WARPS,
            **pdl_options(),
        )
    return q, k, v


@triton.jit
def silu_mul_values(gate, up):
    """``silu(gate) * up`` in ``gate``'s dtype (also the operand of ``skinny_gemm``'s SwiGLU)."""
    g = gate.to(tl.float32)
    # silu rounds to the activation dtype before the product, as F.silu(gate) * up does.
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    return (act * up.to(tl.float32)).to(gate.dtype)


@triton.jit
def _silu_mul_kernel(
    x_ptr, out_ptr, x_stride, WIDTH: tl.constexpr, BLOCK: tl.constexpr, USE_GDC: tl.constexpr
):
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < WIDTH
    gate = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0)
    up = tl.load(x_ptr + row * x_stride + WIDTH + cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * WIDTH + cols, silu_mul_values(gate, up), mask=ok)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :n]) * x[..., n:]`` for ``x`` of last dimension ``2n``."""
    width = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * width)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], width, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        grid = (x2.shape[0], triton.cdiv(width, SILU_BLOCK))
        _silu_mul_kernel[grid](
            x2, out, x2.stride(0), WIDTH=width, BLOCK=SILU_BLOCK, **pdl_options()
        )
    return out.view(*x.shape[:-1], width)
