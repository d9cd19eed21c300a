"""The decode attention kernel's QK prologue (``paged_attention.paged_decode_attention(...,
prologue=)``): Qwen3's QK-norm and RoPE of a row's query heads and new key, and the new K/V's
store to the cache, inside the attention launch instead of ``fused.qk_norm_rope`` before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from engine.model.kernels.fused import norm_rope_halves

if TYPE_CHECKING:
    from engine.model.attention_metadata import QkNormRope


@triton.jit
def query_and_store_kv(
    qkv_ptr, q_weight_ptr, k_weight_ptr, cos_ptr, sin_ptr, positions_ptr, slot_ptr,
    k_cache_ptr, v_cache_ptr, seq, kv_head, split, num_heads, ctx, tiles_per_split,
    qkv_stride, cos_stride, eps, cache_stride_block, cache_stride_token, cache_stride_head,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The group's normed, rotated query ``[GROUP_PAD, HEAD_DIM_PAD]`` from the QKV row of
    ``seq``. The split that holds the context's last token (this step's) first writes that
    token's normed, rotated K and its V to their slot, then waits for the whole program
    (``debug_barrier``), so its loop reads them back from the cache like any other token."""
    half: tl.constexpr = HEAD_DIM // 2
    rows = tl.arange(0, GROUP_PAD)
    cols = tl.arange(0, HEAD_DIM_PAD // 2)
    col_ok = cols < half
    row = qkv_ptr + seq.to(tl.int64) * qkv_stride
    pos = tl.load(positions_ptr + seq).to(tl.int64)
    cos = tl.load(cos_ptr + pos * cos_stride + cols, mask=col_ok, other=0.0)
    sin = tl.load(sin_ptr + pos * cos_stride + cols, mask=col_ok, other=0.0)
    ok = (rows < GROUP)[:, None] & col_ok[None, :]
    src = row + (kv_head * GROUP + rows)[:, None] * HEAD_DIM + cols[None, :]
    w1 = tl.load(q_weight_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(q_weight_ptr + half + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out1, out2 = norm_rope_halves(
        tl.load(src, mask=ok, other=0.0), tl.load(src + half, mask=ok, other=0.0),
        w1, w2, cos, sin, eps, HEAD_DIM,
    )  # fmt: skip
    # [rows, half, 2] -> [rows, 2, half] -> [rows, HEAD_DIM]: the halves side by side.
    q = tl.reshape(tl.permute(tl.join(out1, out2), (0, 2, 1)), (GROUP_PAD, HEAD_DIM_PAD))
    last = ctx - 1  # this step's token; a padding row (ctx 0) has none
    if (last >= 0) & (split == (last // BLOCK_N) // tl.maximum(tiles_per_split, 1)):
        slot = tl.load(slot_ptr + seq).to(tl.int64)
        if slot >= 0:
            k_row = (num_heads + kv_head) * HEAD_DIM + cols[None, :]
            kw1 = tl.load(k_weight_ptr + cols[None, :], mask=col_ok[None, :], other=0.0)
            kw2 = tl.load(k_weight_ptr + half + cols[None, :], mask=col_ok[None, :], other=0.0)
            k1, k2 = norm_rope_halves(
                tl.load(row + k_row, mask=col_ok[None, :], other=0.0),
                tl.load(row + k_row + half, mask=col_ok[None, :], other=0.0),
                kw1.to(tl.float32), kw2.to(tl.float32), cos, sin, eps, HEAD_DIM,
            )  # fmt: skip
            v_row = k_row + (num_heads // GROUP) * HEAD_DIM
            v1 = tl.load(row + v_row, mask=col_ok[None, :], other=0.0)
            v2 = tl.load(row + v_row + half, mask=col_ok[None, :], other=0.0)
            dst = (
                (slot // BLOCK_SIZE) * cache_stride_block
                + (slot % BLOCK_SIZE) * cache_stride_token
                + kv_head * cache_stride_head
                + cols[None, :]
            )
            k_ty = k_cache_ptr.dtype.element_ty
            v_ty = v_cache_ptr.dtype.element_ty
            tl.store(k_cache_ptr + dst, k1.to(k_ty), mask=col_ok[None, :])
            tl.store(k_cache_ptr + dst + half, k2.to(k_ty), mask=col_ok[None, :])
            tl.store(v_cache_ptr + dst, v1.to(v_ty), mask=col_ok[None, :])
            tl.store(v_cache_ptr + dst + half, v2.to(v_ty), mask=col_ok[None, :])
        # Every thread's stores are visible to the whole program before its loop reads them.
        tl.debug_barrier()
    return q


def prologue_args(
    prologue: QkNormRope | None, q: torch.Tensor, placeholder: torch.Tensor
) -> tuple[object, ...]:
    """The kernel's QK-prologue arguments (pointers to ``placeholder`` and zeros without one:
    unused when QK_PROLOGUE is off)."""
    if prologue is None:
        return (q, q, q, q, placeholder, placeholder, 0, 0.0)
    p = prologue
    return (
        p.q_weight, p.k_weight, p.cos_cache, p.sin_cache, p.positions, p.slot_mapping,
        p.cos_cache.stride(0), p.eps,
    )  # fmt: skip
