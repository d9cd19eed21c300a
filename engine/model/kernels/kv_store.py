"""Triton kernel that writes the batch's new K/V into the paged cache through ``slot_mapping``.

One program per token copies that token's K and V rows (``num_kv_heads * head_dim`` elements
each) to slot ``slot_mapping[t]`` of the cache ``[num_blocks, block_size, num_kv_heads,
head_dim]``, viewed flat as ``[num_slots, num_kv_heads * head_dim]``. Slot ``-1`` marks a
padding token (a CUDA-graph batch padded up to its captured size): nothing is written for it.
The kernel takes no host-side decision from the data, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.model.kernels.gdc import gdc_enter
from engine.model.kernels.launch import pdl_options

# Warps per program: one token row is at most a few KiB, so a small program is enough and many
# tokens stay in flight at once.
KV_STORE_NUM_WARPS = 4


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_stride_token,
    k_stride_head,
    v_stride_token,
    v_stride_head,
    HEAD_DIM: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_ROW: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    row = tl.arange(0, BLOCK_ROW)
    head = row // HEAD_DIM
    dim = row % HEAD_DIM
    # A masked store instead of an early return: the same code path for every program.
    live = (row < NUM_KV_HEADS * HEAD_DIM) & (slot >= 0)
    k_src = k_ptr + token.to(tl.int64) * k_stride_token + head * k_stride_head + dim
    v_src = v_ptr + token.to(tl.int64) * v_stride_token + head * v_stride_head + dim
    key = tl.load(k_src, mask=live)
    value = tl.load(v_src, mask=live)
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + row
    tl.store(k_cache_ptr + dst, key.to(k_cache_ptr.dtype.element_ty), mask=live)
    tl.store(v_cache_ptr + dst, value.to(v_cache_ptr.dtype.element_ty), mask=live)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k``/``v`` ``[num_tokens, num_kv_heads, head_dim]`` to their slots in the caches.

    ``k``/``v`` may be strided views (e.g. slices of a fused QKV output) as long as the last
    dimension is contiguous; the caches must be contiguous.
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping has shape {tuple(slot_mapping.shape)}, need {num_tokens}")
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("k and v must be contiguous in their last dimension")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous")
    if tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"cache rows {tuple(k_cache.shape[2:])} do not match k rows {(num_kv_heads, head_dim)}"
        )
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        HEAD_DIM=head_dim,
        NUM_KV_HEADS=num_kv_heads,
        BLOCK_ROW=triton.next_power_of_2(num_kv_heads * head_dim),
        num_warps=KV_STORE_NUM_WARPS,
        **pdl_options(),
    )
