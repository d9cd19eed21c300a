"""Long-prompt prefill attention for Hopper (Triton): tiles moved by TMA.

The same attention as ``prefill_attention._prefill_kernel`` (varlen, causal, keys fresh or
through the block table), shaped for the tensor-memory accelerator: every Q, K and V tile is a
rectangle of a 2-D view (``[tokens, heads x dim]`` for Q and fresh K/V, ``[blocks x block_size,
kv_heads x dim]`` for the cache), so it moves by one asynchronous bulk copy instead of per-thread
loads, and the loop over key tiles carries no load masks:

- a key tile never crosses a cache page (``block_size % block_n == 0``), so a page lookup per
  tile names its rows; rows past a sequence's context are masked by the causal rule alone (what
  they hold is finite: the cache is zero-initialised and only ever holds stored keys);
- query rows past a sequence's last token (the next sequence's rows, or the view's zero fill)
  are computed and never stored;
- key tiles strictly before the tile's first query need no mask and no ``where``: their scale
  is applied once to the row maximum (one multiply-add an element, as FlashAttention-2 does);
- ``P @ V`` accumulates in the MMA (``tl.dot(p, v, acc)``).

A program takes ``block_m`` tokens of one query head (GQA groups share K/V through L2), or with
``pair_heads`` of two heads of one KV group (each K/V tile feeds two score tiles, and one
head's softmax can run under the other's matrix products), so the grid is ``(query tiles, heads
or head pairs, sequences)``; with ``heavy_first`` the latest query tiles (the most keys) start
first. Half precision only, compute capability 9+, eager launches (descriptors
are built on the host per launch). ``tma_prefill_fits`` says whether a launch can take it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.model.kernels.gdc import gdc_enter
from engine.model.kernels.launch import pdl_options
from engine.model.kernels.paged_attention import LOG2E

# (block_m, block_n, num_warps, num_stages, heavy_first, pair_heads) of long prompts, keys
# fresh / through the cache (figures: docs/gpu-notes.md, session 17). ``pair_heads``: a program
# takes two query heads of one KV group (GQA groups of even size only), so each K/V tile feeds
# two score tiles.
TMA_FRESH_TILING = (128, 64, 8, 3, True, True)
TMA_PAGED_TILING = (64, 64, 4, 2, True, True)
# Bulk copies need 16-byte aligned bases and row strides.
TMA_ALIGN_BYTES = 16


def _tma_view_ok(t: torch.Tensor) -> bool:
    """Whether ``[tokens, heads, dim]`` (or a cache ``[blocks, size, heads, dim]``) reads as the
    2-D rectangle ``[rows, heads x dim]`` a descriptor describes."""
    size = t.element_size()
    return (
        t.stride(-1) == 1
        and t.stride(-2) == t.shape[-1]
        and (t.dim() == 3 or t.stride(0) == t.shape[1] * t.stride(1))
        and t.data_ptr() % TMA_ALIGN_BYTES == 0
        and (t.stride(-3) * size) % TMA_ALIGN_BYTES == 0
    )


def tma_prefill_fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     k_cache: torch.Tensor | None, v_cache: torch.Tensor | None,
                     block_n: int) -> bool:
    """Whether this launch can run the TMA kernel: CUDA half precision on compute capability 9+,
    a power-of-two head size, Q (and K/V or the caches) viewable as 2-D rectangles, and cache
    pages a whole number of key tiles."""
    if not (q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)):
        return False
    if torch.cuda.get_device_capability(q.device)[0] < 9:
        return False
    head_dim = q.shape[-1]
    if head_dim < 16 or head_dim & (head_dim - 1):
        return False
    if k_cache is not None:
        assert v_cache is not None
        return (k_cache.shape[1] % block_n == 0 and _tma_view_ok(q)
                and _tma_view_ok(k_cache) and _tma_view_ok(v_cache))
    return _tma_view_ok(q) and _tma_view_ok(k) and _tma_view_ok(v)


def _descriptor(t: torch.Tensor, block_rows: int) -> object:
    """A host-side TMA descriptor of ``t`` (``[tokens, heads, dim]`` or a cache ``[blocks,
    block_size, heads, dim]``, checked by ``_tma_view_ok``) as the rectangle ``[rows, heads x
    dim]``, in tiles of ``block_rows`` rows x one head."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = t.shape[0] * (t.shape[1] if t.dim() == 4 else 1)
    return TensorDescriptor(t, [rows, t.shape[-2] * t.shape[-1]], [t.stride(-3), 1],
                            [block_rows, t.shape[-1]])


@triton.jit
def _online_softmax_step(acc, l_i, m_i, qk, v, start, q_pos, qk_scale,
                         BLOCK_N: tl.constexpr, MASK: tl.constexpr):
    """One key tile's scores ``qk`` (unscaled) into the running max, sum and ``acc``."""
    if MASK:
        keys = start + tl.arange(0, BLOCK_N)
        qk = tl.where(keys[None, :] <= q_pos[:, None], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_new[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_new[:, None]
    p = tl.exp2(qk)
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _attend_key_tiles(acc, l_i, m_i, acc2, l_2, m_2, q, q2, desc_k, desc_v, table, seq_row0,
                      key_lo, key_hi, q_pos, kv_col, qk_scale, BLOCK_N: tl.constexpr,
                      BLOCK_SIZE: tl.constexpr, PAGED: tl.constexpr, MASK: tl.constexpr,
                      PAIR: tl.constexpr):
    for start in tl.range(key_lo, key_hi, BLOCK_N):
        start = tl.multiple_of(start, BLOCK_N)
        if PAGED:
            page = tl.load(table + start // BLOCK_SIZE)
            key_row = page * BLOCK_SIZE + start % BLOCK_SIZE
        else:
            key_row = seq_row0 + start
        k = desc_k.load([key_row, kv_col])
        qk = tl.dot(q, k.T)
        if PAIR:  # the second head's scores run while the first head's softmax does
            qk2 = tl.dot(q2, k.T)
        v = desc_v.load([key_row, kv_col])
        acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, qk, v, start, q_pos, qk_scale,
                                             BLOCK_N, MASK)
        if PAIR:
            acc2, l_2, m_2 = _online_softmax_step(acc2, l_2, m_2, qk2, v, start, q_pos,
                                                  qk_scale, BLOCK_N, MASK)
    return acc, l_i, m_i, acc2, l_2, m_2


@triton.jit
def _store_rows(out_ptr, acc, l_i, row0, first, head, q_len, out_stride_token, out_stride_head,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The tile's normalised output rows of one head, those inside the prompt only."""
    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    o_offs = (row0 + first + rows).to(tl.int64) * out_stride_token + head * out_stride_head
    tl.store(out_ptr + o_offs[:, None] + dims[None, :],
             (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
             mask=(first + rows < q_len)[:, None])


# Values that change from step to step must not trigger a recompile.
@triton.jit(do_not_specialize=["bt_stride_seq"])
def _tma_prefill_kernel(
    desc_q,
    desc_k,
    desc_v,
    block_tables_ptr,
    cu_seqlens_q_ptr,
    context_lens_ptr,
    out_ptr,
    qk_scale,
    out_stride_token,
    out_stride_head,
    bt_stride_seq,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PAGED: tl.constexpr,
    HEAVY_FIRST: tl.constexpr,
    PAIR: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    tile = tl.program_id(0)
    if HEAVY_FIRST:
        tile = tl.num_programs(0) - 1 - tile
    head = tl.program_id(1) * (2 if PAIR else 1)
    seq = tl.program_id(2)
    row0 = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - row0
    first = tile * BLOCK_M
    if first < q_len:
        offset = tl.load(context_lens_ptr + seq) - q_len  # position of the first new token
        kv_col = (head // GROUP) * HEAD_DIM
        q_pos = offset + first + tl.arange(0, BLOCK_M)
        q = desc_q.load([row0 + first, head * HEAD_DIM])
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        if PAIR:  # the next head of the same KV group shares every K/V tile
            q2 = desc_q.load([row0 + first, (head + 1) * HEAD_DIM])
            m_2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_2 = tl.zeros([BLOCK_M], tl.float32)
            acc2 = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        else:  # carried through the loops untouched
            q2, m_2, l_2, acc2 = 0.0, 0.0, 0.0, 0.0
        table = block_tables_ptr + seq.to(tl.int64) * bt_stride_seq
        # Keys before the tile's first query are visible to every row: no causal mask there.
        # Every row sees key ``unmasked_end`` in its first tile, so no row's maximum stays -inf.
        unmasked_end = ((offset + first) // BLOCK_N) * BLOCK_N
        key_end = offset + tl.minimum(first + BLOCK_M, q_len)
        acc, l_i, m_i, acc2, l_2, m_2 = _attend_key_tiles(
            acc, l_i, m_i, acc2, l_2, m_2, q, q2, desc_k, desc_v, table, row0, 0, unmasked_end,
            q_pos, kv_col, qk_scale, BLOCK_N, BLOCK_SIZE, PAGED, False, PAIR,
        )  # fmt: skip
        acc, l_i, m_i, acc2, l_2, m_2 = _attend_key_tiles(
            acc, l_i, m_i, acc2, l_2, m_2, q, q2, desc_k, desc_v, table, row0, unmasked_end,
            key_end, q_pos, kv_col, qk_scale, BLOCK_N, BLOCK_SIZE, PAGED, True, PAIR,
        )  # fmt: skip
        _store_rows(out_ptr, acc, l_i, row0, first, head, q_len, out_stride_token,
                    out_stride_head, BLOCK_M, HEAD_DIM)
        if PAIR:
            _store_rows(out_ptr, acc2, l_2, row0, first, head + 1, q_len, out_stride_token,
                        out_stride_head, BLOCK_M, HEAD_DIM)


def tma_prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    max_seqlen_q: int,
    scale: float,
    out: torch.Tensor,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    block_tables: torch.Tensor | None = None,
    tiling: tuple[int, int, int, int, bool, bool] | None = None,
) -> torch.Tensor:
    """``prefill_attention``'s contract (its docstring) through the TMA kernel; the caller has
    checked ``tma_prefill_fits``. ``tiling``: ``(block_m, block_n, num_warps, num_stages,
    heavy_first, pair_heads)``, None: the module's for fresh keys or the cache (pairs only where
    the GQA group is even)."""
    paged = k_cache is not None
    block_m, block_n, warps, stages, heavy, pair = tiling or (
        TMA_PAGED_TILING if paged else TMA_FRESH_TILING)
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k.shape[1]
    pair = pair and group % 2 == 0
    desc_q = _descriptor(q, block_m)
    if paged:
        assert v_cache is not None and block_tables is not None
        desc_k, desc_v = _descriptor(k_cache, block_n), _descriptor(v_cache, block_n)
        table, block_size, bt_stride = block_tables, k_cache.shape[1], block_tables.stride(0)
    else:
        desc_k, desc_v = _descriptor(k, block_n), _descriptor(v, block_n)
        table, block_size, bt_stride = context_lens, 1, 0  # table unused when not paged
    num_seqs = context_lens.shape[0]
    grid = (triton.cdiv(max_seqlen_q, block_m), num_heads // (2 if pair else 1), num_seqs)
    _tma_prefill_kernel[grid](
        desc_q, desc_k, desc_v, table, cu_seqlens_q, context_lens, out,
        scale * LOG2E, out.stride(0), out.stride(1), bt_stride,
        HEAD_DIM=head_dim, GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_SIZE=block_size, PAGED=paged, HEAVY_FIRST=heavy, PAIR=pair,
        num_warps=warps, num_stages=stages, **pdl_options(),
    )  # fmt: skip
    return out
