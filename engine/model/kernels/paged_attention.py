"""Decode attention over the paged KV cache, read in place (Triton, flash-decoding style).

Each decode sequence has one query token. Program ``(seq, kv_head, split)`` handles the query
heads that share ``kv_head`` (grouped-query attention: K/V are read once for the whole group)
over one contiguous slice of the sequence's context, reading K/V rows straight from the cache
pages named by the block table, with an online softmax. With one split the program writes the
final output; with several, each writes an unnormalised partial (running max, sum, weighted
values) and a second kernel merges the partials.

Why splits: at batch 256 there are 256 x 8 programs, enough to fill the GPU; at batch 4 there
would be 32, and 100 of the 132 multiprocessors would idle while a few read long contexts.
The split count is fixed per launch (so a CUDA graph can capture it) while the slice each split
reads is computed on the device from ``context_lens``: every split of a sequence gets an equal
share of that sequence's context, whatever its length, and nothing depends on the host.

Padding rows of a graph batch have ``context_lens == 0``: they read nothing and output zeros.

Why an order: programs are handed to multiprocessors roughly in launch order, and a batch's
contexts differ several-fold, so a long sequence whose programs start last leaves most of the
GPU idle while it finishes. With ``order`` (the rows sorted by context, longest first: the
runner stages it with the step's inputs) the longest programs start first and the short ones
fill in behind them. The row is the grid's slowest axis, so all of a row's splits launch
together: were the split slowest, a long row among few (one 8k-token row beside short ones, 16
splits) would start its first split in the first wave and its last ones after every short
row's, and run about a wave longer. Each program computes the same values in any order:
outputs are identical.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from engine.attention_splits import choose_num_splits, decode_grid
from engine.model.kernels.decode_prologue import prologue_args, query_and_store_kv
from engine.model.kernels.gdc import gdc_enter
from engine.model.kernels.launch import pdl_options

if TYPE_CHECKING:
    from engine.model.attention_metadata import QkNormRope

# Keys per inner-loop tile: 64 rows x 128 dims of bf16 K and V is 32 KiB per tile in flight.
DECODE_BLOCK_N = 64
DECODE_NUM_WARPS = 4
DECODE_NUM_STAGES = 3
DECODE_HEADS_FASTEST = True
# tl.dot needs at least 16 rows: a GQA group (2 heads for Qwen3-0.6B) is padded up to this.
MIN_DOT_ROWS = 16
LOG2E = 1.4426950408889634


def prologue_fits(head_dim: int) -> bool:
    """Whether the kernel can take its query from QKV rows (``prologue``): it rebuilds a head
    from its rotated halves in registers, so the halves' padded width twice over must be the
    head's padded width."""
    return head_dim >= MIN_DOT_ROWS and head_dim & (head_dim - 1) == 0


# Values that change from step to step must not trigger a recompile.
@triton.jit(do_not_specialize=["bt_stride_seq"])
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    order_ptr,
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    q_weight_ptr,
    k_weight_ptr,
    cos_ptr,
    sin_ptr,
    positions_ptr,
    slot_ptr,
    cos_stride,
    eps,
    qk_scale,
    q_stride_seq,
    q_stride_head,
    out_stride_seq,
    out_stride_head,
    bt_stride_seq,
    cache_stride_block,
    cache_stride_token,
    cache_stride_head,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
    HEADS_FASTEST: tl.constexpr,
    ORDERED: tl.constexpr,
    QK_PROLOGUE: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    # The grid is attention_splits.decode_grid's: the row slowest, so with ORDERED all of the
    # longest row's splits start first (module docstring).
    if HEADS_FASTEST:
        # Neighbouring programs read neighbouring 256-byte rows of the same tokens.
        kv_head = tl.program_id(0)
        split = tl.program_id(1)
        num_heads = tl.num_programs(0) * GROUP
    else:
        split = tl.program_id(0)
        kv_head = tl.program_id(1)
        num_heads = tl.num_programs(1) * GROUP
    seq = tl.program_id(2)
    if ORDERED:
        seq = tl.load(order_ptr + seq)  # the seq-th row of programs takes the seq-th longest row

    ctx = tl.load(context_lens_ptr + seq)
    # Whole tiles per split, so only a sequence's last tile is ragged.
    num_tiles = tl.cdiv(ctx, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, ctx)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    heads = kv_head * GROUP + rows
    if QK_PROLOGUE:
        # q_ptr is the QKV projection's row: norm and rotate the group's query heads here, and
        # the program that reads the context's last token first writes that token's K/V.
        q = query_and_store_kv(
            q_ptr, q_weight_ptr, k_weight_ptr, cos_ptr, sin_ptr, positions_ptr, slot_ptr,
            k_cache_ptr, v_cache_ptr, seq, kv_head, split, num_heads, ctx, tiles_per_split,
            q_stride_seq, cos_stride, eps, cache_stride_block, cache_stride_token,
            cache_stride_head, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, GROUP, GROUP_PAD, BLOCK_N,
        )  # fmt: skip
    else:
        q_offs = seq.to(tl.int64) * q_stride_seq + heads[:, None] * q_stride_head + dims[None, :]
        q = tl.load(q_ptr + q_offs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * bt_stride_seq
    for tile_start in range(start, end, BLOCK_N):
        toks = tile_start + tl.arange(0, BLOCK_N)
        tok_ok = toks < end
        page = tl.load(table + toks // BLOCK_SIZE, mask=tok_ok, other=0).to(tl.int64)
        kv_offs = (
            page * cache_stride_block
            + (toks % BLOCK_SIZE) * cache_stride_token
            + kv_head * cache_stride_head
        )
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + kv_offs[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offs[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = tl.where(tok_ok[None, :], scores * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out_mask = row_ok[:, None] & dim_ok[None, :]
    if NUM_SPLITS == 1:
        # l_i == 0 only for an empty context (a padding row): write zeros, not 0/0.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_offs = seq.to(tl.int64) * out_stride_seq + heads[:, None] * out_stride_head
        tl.store(out_ptr + o_offs + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        part = (seq.to(tl.int64) * num_heads + heads) * NUM_SPLITS + split
        tl.store(part_max_ptr + part, m_i, mask=row_ok)
        tl.store(part_sum_ptr + part, l_i, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM_PAD + dims[None, :], acc, mask=out_mask)


@triton.jit
def _decode_merge_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    out_stride_seq,
    out_stride_head,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    split_ok = splits < NUM_SPLITS
    part = (seq.to(tl.int64) * num_heads + head) * NUM_SPLITS + splits
    m = tl.load(part_max_ptr + part, mask=split_ok, other=float("-inf"))
    l = tl.load(part_sum_ptr + part, mask=split_ok, other=0.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_DIM_PAD + dims[None, :],
        mask=split_ok[:, None] & (dims[None, :] < HEAD_DIM),
        other=0.0,
    )
    m_all = tl.max(m, 0)
    # Empty splits (and whole padding rows) have m = -inf: weight 0, and no -inf - -inf.
    m_safe = tl.where(m_all > float("-inf"), m_all, 0.0)
    weight = tl.where(m > float("-inf"), tl.exp2(m - m_safe), 0.0)
    total = tl.sum(l * weight, 0)
    out = tl.sum(acc * weight[:, None], 0) / tl.where(total > 0, total, 1.0)
    o_offs = seq.to(tl.int64) * out_stride_seq + head * out_stride_head + dims
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_n: int = DECODE_BLOCK_N,
    num_warps: int = DECODE_NUM_WARPS,
    num_stages: int = DECODE_NUM_STAGES,
    heads_fastest: bool = DECODE_HEADS_FASTEST,
    order: torch.Tensor | None = None,
    prologue: QkNormRope | None = None,
) -> torch.Tensor:
    """One query per sequence against its paged context.

    ``q`` ``[num_seqs, num_heads, head_dim]``; caches ``[num_blocks, block_size, num_kv_heads,
    head_dim]`` (any strides with the last dimension contiguous, both caches alike);
    ``block_tables`` int32 ``[num_seqs, width]``; ``context_lens`` int32
    ``[num_seqs]`` (0: a padding row, output zeros). ``num_splits`` None picks by batch size;
    it and the tiling arguments are fixed per call, so a captured graph replays them as is.
    ``order`` int32 ``[num_seqs]``, a permutation of the rows: the order in which programs take
    them (longest context first, see the module docstring); None: row order.

    With ``prologue``, ``q`` is the query part of the QKV projection's rows (a view, each row
    going on with the K heads, then the V heads), not yet normed or rotated: the kernel norms
    and rotates it, and writes each row's new K/V (the row's last context token) to its slot
    before reading the context, so the caches need not hold them yet
    (``engine.model.attention_metadata.QkNormRope``).
    """
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"q {tuple(q.shape)} does not fit a cache of {num_kv_heads} heads x {cache_dim}"
        )
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError(
            "q and the caches must be contiguous in their last dimension, and the two caches "
            "laid out alike"
        )
    if block_tables.stride(-1) != 1:
        raise ValueError("block_tables must be contiguous in its last dimension")
    if order is not None and order.shape != (num_seqs,):
        raise ValueError(f"order has shape {tuple(order.shape)}, need ({num_seqs},)")
    if prologue is not None:
        row_width = (num_heads + 2 * num_kv_heads) * head_dim
        # One row's stride is whatever its view made it, and unused (the kernel reads row 0).
        short_rows = num_seqs > 1 and q.stride(0) < row_width
        if not prologue_fits(head_dim) or q.stride(1) != head_dim or short_rows:
            raise ValueError(
                f"a QK prologue needs q as the query part of QKV rows with a power-of-two "
                f"head_dim >= {MIN_DOT_ROWS}; got shape {tuple(q.shape)}, strides {q.stride()}"
            )
        if prologue.slot_mapping.shape != (num_seqs,) or prologue.positions.shape != (num_seqs,):
            raise ValueError(f"a QK prologue needs {num_seqs} positions and slots")
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    splits = num_splits if num_splits is not None else choose_num_splits(num_seqs, num_kv_heads)
    dim_pad = max(MIN_DOT_ROWS, triton.next_power_of_2(head_dim))
    if splits > 1:
        part_acc = torch.empty(
            num_seqs * num_heads * splits, dim_pad, dtype=torch.float32, device=q.device
        )
        part_max = torch.empty(num_seqs * num_heads * splits, dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_acc = part_max = part_sum = out  # unused by the one-split path
    grid = decode_grid(num_seqs, num_kv_heads, splits, heads_fastest)
    _decode_split_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        context_lens if order is None else order,  # unused without ORDERED
        out,
        part_acc,
        part_max,
        part_sum,
        *prologue_args(prologue, q, context_lens),
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=dim_pad,
        GROUP=group,
        GROUP_PAD=max(MIN_DOT_ROWS, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        NUM_SPLITS=splits,
        IEEE=q.dtype == torch.float32,
        HEADS_FASTEST=heads_fastest,
        ORDERED=order is not None,
        QK_PROLOGUE=prologue is not None,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_options(),
    )
    if splits > 1:
        _decode_merge_kernel[(num_seqs, num_heads)](
            out,
            part_acc,
            part_max,
            part_sum,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=dim_pad,
            NUM_SPLITS=splits,
            SPLITS_PAD=triton.next_power_of_2(splits),
            **pdl_options(),
        )
    return out
