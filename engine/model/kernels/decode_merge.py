"""How a decode step's split partials become its attention output (``paged_attention.py``):
the merge kernel, launched after the split kernel, or inline, by the last of a row's split
programs to finish (``paged_decode_attention(..., inline_merge=True)``), one launch fewer.

Inline, each split program stores its partials, then counts itself in on its (row, KV head)'s
arrival counter (an atomic add with release and acquire order, after a barrier of the whole
program); the one that arrives last reads every split's partials from L2 (other
multiprocessors wrote them: L1 is not coherent) and writes the output, then sets the counter
back to 0, so the counters are zero before and after every launch, as a CUDA graph replays them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention_splits import TARGET_PROGRAMS
from engine.model.kernels.gdc import gdc_enter

_ARRIVALS: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device, count: int) -> torch.Tensor | None:
    """Zeroed int32 counters, at least ``count``, kept per device for every launch (each
    launch leaves them at zero). None while a CUDA graph is being captured and the kept ones are
    too few: an allocation then would belong to the graph (the caller merges with the kernel)."""
    kept = _ARRIVALS.get(device)
    if kept is not None and kept.numel() >= count:
        return kept
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    # Split launches have fewer than TARGET_PROGRAMS (row, KV head) pairs unless a caller
    # forces the split count: one allocation serves every engine launch.
    kept = torch.zeros(max(count, TARGET_PROGRAMS), dtype=torch.int32, device=device)
    _ARRIVALS[device] = kept
    return kept


@triton.jit
def merge_partials(part_acc_ptr, part_max_ptr, part_sum_ptr, part_rows, HEAD_DIM: tl.constexpr,
                   HEAD_DIM_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr,
                   SPLITS_PAD: tl.constexpr, FROM_L2: tl.constexpr):  # fmt: skip
    """The attention output ``[rows, HEAD_DIM_PAD]`` (float32) of the heads whose partials
    start at ``part_rows * NUM_SPLITS``: each split's running max, sum and weighted values,
    rescaled to the common max and summed. ``FROM_L2``: read past the multiprocessor's L1, for
    partials other programs of the same launch wrote."""
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    split_ok = (splits < NUM_SPLITS)[None, :]
    part = part_rows[:, None] * NUM_SPLITS + splits[None, :]
    acc_ptrs = part_acc_ptr + part[:, :, None] * HEAD_DIM_PAD + dims[None, None, :]
    acc_ok = split_ok[:, :, None] & (dims < HEAD_DIM)[None, None, :]
    if FROM_L2:
        m = tl.load(part_max_ptr + part, mask=split_ok, other=float("-inf"), cache_modifier=".cg")
        l = tl.load(part_sum_ptr + part, mask=split_ok, other=0.0, cache_modifier=".cg")
        acc = tl.load(acc_ptrs, mask=acc_ok, other=0.0, cache_modifier=".cg")
    else:
        m = tl.load(part_max_ptr + part, mask=split_ok, other=float("-inf"))
        l = tl.load(part_sum_ptr + part, mask=split_ok, other=0.0)
        acc = tl.load(acc_ptrs, mask=acc_ok, other=0.0)
    m_all = tl.max(m, 1)
    # Empty splits (and whole padding rows) have m = -inf: weight 0, and no -inf - -inf.
    m_safe = tl.where(m_all > float("-inf"), m_all, 0.0)
    weight = tl.where(m > float("-inf"), tl.exp2(m - m_safe[:, None]), 0.0)
    total = tl.sum(l * weight, 1)
    return tl.sum(acc * weight[:, :, None], 1) / tl.where(total > 0, total, 1.0)[:, None]


@triton.jit
def decode_merge_kernel(
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
    row = seq.to(tl.int64) * num_heads + head + tl.zeros([1], tl.int64)
    out = merge_partials(part_acc_ptr, part_max_ptr, part_sum_ptr, row, HEAD_DIM, HEAD_DIM_PAD,
                         NUM_SPLITS, SPLITS_PAD, False)  # fmt: skip
    dims = tl.arange(0, HEAD_DIM_PAD)
    o_offs = seq.to(tl.int64) * out_stride_seq + head * out_stride_head + dims[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=(dims < HEAD_DIM)[None, :])


@triton.jit
def merge_if_last(out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, arrivals_ptr, seq, kv_head,
                  num_heads, out_stride_seq, out_stride_head, HEAD_DIM: tl.constexpr,
                  HEAD_DIM_PAD: tl.constexpr, GROUP: tl.constexpr, GROUP_POW2: tl.constexpr,
                  NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr):  # fmt: skip
    """After a split program stored its partials: count it in for its (row, KV head); the last
    of the row's splits to arrive merges the group's heads and writes their output, then sets
    the count back to 0 for the next launch. The merge kernel's launch is not needed."""
    num_kv_heads = num_heads // GROUP
    counter = arrivals_ptr + seq.to(tl.int64) * num_kv_heads + kv_head
    tl.debug_barrier()  # every thread's partials are stored before the count is released
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if arrived == NUM_SPLITS - 1:
        rows = tl.arange(0, GROUP_POW2)
        heads = kv_head * GROUP + rows
        out = merge_partials(
            part_acc_ptr, part_max_ptr, part_sum_ptr, seq.to(tl.int64) * num_heads + heads,
            HEAD_DIM, HEAD_DIM_PAD, NUM_SPLITS, SPLITS_PAD, True,
        )  # fmt: skip
        dims = tl.arange(0, HEAD_DIM_PAD)
        o_offs = seq.to(tl.int64) * out_stride_seq + heads[:, None] * out_stride_head
        ok = (rows < GROUP)[:, None] & (dims < HEAD_DIM)[None, :]
        tl.store(out_ptr + o_offs + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=ok)
        tl.store(counter, 0)
