"""Prefill attention (Triton): varlen causal attention, keys read from the paged cache.

Sequence ``s`` has ``q_len = cu_seqlens_q[s+1] - cu_seqlens_q[s]`` new tokens at positions
``[ctx - q_len, ctx)`` (``ctx = context_lens[s]``); query ``i`` attends to keys ``[0, ctx - q_len
+ i]``. With ``paged=True`` every key is read through the block table, so a prefix-cache hit or
an earlier chunk is simply more context; with ``paged=False`` (no cache yet, or no cached
context) keys come from the packed fresh ``k``/``v`` of the batch.

Program ``(query tile, seq, kv_head)`` takes ``TILE_TOKENS`` queries of one sequence for all
the query heads that share ``kv_head`` (rows ordered token-major, head-minor), so each K/V tile
is loaded once per GQA group. Key tiles strictly before the tile's first query need no causal
mask; only the diagonal band is masked.

Under the causal mask a query tile's work grows with its position, and programs start about in
launch order (query tiles fastest); so with ``heavy_first`` program ``i`` takes query tile
``tiles - 1 - i``: each head's longest tiles start first and the short ones fill the tail (what
FlashAttention's causal schedulers do). The values each program computes are the same. It is
part of the tiling: measured faster for long prompts with fresh keys only (through the block
table at 32k tokens it was slower; docs/gpu-notes.md, session 12).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.model.kernels.gdc import gdc_enter
from engine.model.kernels.launch import pdl_options
from engine.model.kernels.long_prefill import (
    LONG_PREFILL_TOKENS,
    ROUTES,
    flash_sdpa_prefill,
    long_prefill_route,
)
from engine.model.kernels.paged_attention import LOG2E, MIN_DOT_ROWS

# Query rows per program (tokens x GQA group) and keys per inner tile.
PREFILL_BLOCK_ROWS = 64
PREFILL_BLOCK_N = 64
PREFILL_NUM_WARPS = 4
PREFILL_NUM_STAGES = 2
# Prompts of at least LONG_PREFILL_TOKENS new tokens (the longest in a launch) take their own
# tiling: enough query tiles to fill the GPU with larger ones (figures: docs/gpu-notes.md).
# (block_rows, block_n, num_warps, num_stages, heavy_first) of long prompts, keys fresh /
# through the cache.
LONG_FRESH_TILING = (128, 128, 8, 3, True)
LONG_PAGED_TILING = (128, 128, 8, 2, False)
# Query tiles in launch order below LONG_PREFILL_TOKENS (module docstring: ``heavy_first``).
PREFILL_HEAVY_FIRST = False


def prefill_tiling(max_seqlen_q: int, paged: bool = True) -> dict[str, int | bool]:
    """The kernel's tiling for a launch whose longest prompt has ``max_seqlen_q`` new tokens
    (a host value fixed per launch, so a captured graph replays it as is)."""
    if max_seqlen_q >= LONG_PREFILL_TOKENS:
        rows, block_n, warps, stages, heavy = LONG_PAGED_TILING if paged else LONG_FRESH_TILING
    else:
        rows, block_n, warps, stages, heavy = (PREFILL_BLOCK_ROWS, PREFILL_BLOCK_N,
                                               PREFILL_NUM_WARPS, PREFILL_NUM_STAGES,
                                               PREFILL_HEAVY_FIRST)
    return {"block_rows": rows, "block_n": block_n, "num_warps": warps, "num_stages": stages,
            "heavy_first": heavy}


@triton.jit
def _attend_tiles(
    q,
    acc,
    m_i,
    l_i,
    k_src,
    v_src,
    table,
    seq_row0,
    key_lo,
    key_hi,
    q_pos,
    kv_head,
    qk_scale,
    k_stride_token,
    k_stride_head,
    v_stride_token,
    v_stride_head,
    cache_stride_block,
    cache_stride_token,
    cache_stride_head,
    dims,
    dim_ok,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    IEEE: tl.constexpr,
):
    for tile_start in range(key_lo, key_hi, BLOCK_N):
        keys = tile_start + tl.arange(0, BLOCK_N)
        key_ok = keys < key_hi
        if PAGED:
            page = tl.load(table + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
            k_offs = (
                page * cache_stride_block
                + (keys % BLOCK_SIZE) * cache_stride_token
                + kv_head * cache_stride_head
            )
            v_offs = k_offs
        else:
            rows = (seq_row0 + keys).to(tl.int64)
            k_offs = rows * k_stride_token + kv_head * k_stride_head
            v_offs = rows * v_stride_token + kv_head * v_stride_head
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_src + k_offs[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_src + v_offs[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = scores * qk_scale
        if CAUSAL_MASK:
            allowed = key_ok[None, :] & (keys[None, :] <= q_pos[:, None])
        else:
            allowed = key_ok[None, :] & (q_pos[:, None] >= 0)
        scores = tl.where(allowed, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        # Rows with nothing allowed yet keep m = -inf; use 0 there so exp2 never sees -inf - -inf.
        m_use = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(scores - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


# Values that change from step to step must not trigger a recompile.
@triton.jit(do_not_specialize=["bt_stride_seq", "num_seqs"])
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    block_tables_ptr,
    cu_seqlens_q_ptr,
    context_lens_ptr,
    out_ptr,
    num_seqs,
    qk_scale,
    q_stride_token,
    q_stride_head,
    k_stride_token,
    k_stride_head,
    v_stride_token,
    v_stride_head,
    out_stride_token,
    out_stride_head,
    bt_stride_seq,
    cache_stride_block,
    cache_stride_token,
    cache_stride_head,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    IEEE: tl.constexpr,
    HEAVY_FIRST: tl.constexpr,
    USE_GDC: tl.constexpr,
    FLAT_SLOTS: tl.constexpr,
):
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    tile = tl.program_id(0)
    if HEAVY_FIRST:
        tile = tl.num_programs(0) - 1 - tile
    if FLAT_SLOTS:
        # Axis 0 runs over every sequence's query tiles in turn (``flat_tiles``): find the
        # sequence whose tiles hold this one from the tile counts of all sequences.
        slots = tl.arange(0, FLAT_SLOTS)
        starts = tl.load(cu_seqlens_q_ptr + slots, mask=slots < num_seqs, other=0)
        ends = tl.load(cu_seqlens_q_ptr + slots + 1, mask=slots < num_seqs, other=0)
        tiles = (ends - starts + TILE_TOKENS - 1) // TILE_TOKENS
        seq = tl.sum((tl.cumsum(tiles, 0) <= tile).to(tl.int32), 0)
        tile -= tl.sum(tl.where(slots < seq, tiles, 0), 0)
        live = seq < num_seqs  # else past every sequence's tiles: nothing to do
        seq = tl.minimum(seq, num_seqs - 1)
        kv_head = tl.program_id(1)
    else:
        seq = tl.program_id(1)
        kv_head = tl.program_id(2)
    row0 = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - row0
    if FLAT_SLOTS:
        q_len = tl.where(live, q_len, 0)
    first = tile * TILE_TOKENS
    if first < q_len:
        ctx = tl.load(context_lens_ptr + seq)
        offset = ctx - q_len  # position of the first new token
        rows = tl.arange(0, BLOCK_ROWS)
        tok = first + rows // GROUP
        row_ok = (rows < TILE_TOKENS * GROUP) & (tok < q_len)
        heads = kv_head * GROUP + rows % GROUP
        dims = tl.arange(0, HEAD_DIM_PAD)
        dim_ok = dims < HEAD_DIM
        io_mask = row_ok[:, None] & dim_ok[None, :]
        q_offs = (row0 + tok).to(tl.int64) * q_stride_token + heads * q_stride_head
        q = tl.load(q_ptr + q_offs[:, None] + dims[None, :], mask=io_mask, other=0.0)
        # Padding rows get position -1: they attend to nothing and are never stored.
        q_pos = tl.where(row_ok, offset + tok, -1)

        m_i = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_ROWS], tl.float32)
        acc = tl.zeros([BLOCK_ROWS, HEAD_DIM_PAD], tl.float32)
        table = block_tables_ptr + seq.to(tl.int64) * bt_stride_seq
        # Keys before the tile's first query are visible to every row: no causal mask there.
        unmasked_end = ((offset + first) // BLOCK_N) * BLOCK_N
        last_tok = tl.minimum(first + TILE_TOKENS, q_len) - 1
        key_end = offset + last_tok + 1
        acc, m_i, l_i = _attend_tiles(
            q, acc, m_i, l_i, k_ptr, v_ptr, table, row0, 0, unmasked_end, q_pos, kv_head,
            qk_scale, k_stride_token, k_stride_head, v_stride_token, v_stride_head,
            cache_stride_block, cache_stride_token, cache_stride_head, dims, dim_ok,
            BLOCK_SIZE, BLOCK_N, PAGED, False, IEEE,
        )  # fmt: skip
        acc, m_i, l_i = _attend_tiles(
            q, acc, m_i, l_i, k_ptr, v_ptr, table, row0, unmasked_end, key_end, q_pos, kv_head,
            qk_scale, k_stride_token, k_stride_head, v_stride_token, v_stride_head,
            cache_stride_block, cache_stride_token, cache_stride_head, dims, dim_ok,
            BLOCK_SIZE, BLOCK_N, PAGED, True, IEEE,
        )  # fmt: skip
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_offs = (row0 + tok).to(tl.int64) * out_stride_token + heads * out_stride_head
        tl.store(
            out_ptr + o_offs[:, None] + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=io_mask,
        )


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    max_seqlen_q: int,
    scale: float,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    block_tables: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    block_rows: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    route: str | None = None,
    heavy_first: bool | None = None,
    flat_tiles: bool = False,
) -> torch.Tensor:
    """Causal varlen attention for ``num_seqs = len(context_lens)`` prefill sequences.

    ``q`` ``[tokens, heads, dim]``; ``k``/``v`` ``[tokens, kv_heads, dim]`` (read only when no
    cache is given, then every ``context_lens[s]`` must equal the sequence's query length);
    ``cu_seqlens_q`` int32 ``[num_seqs + 1]``. Writes ``out`` rows of these sequences only.
    Tiling arguments left None come from ``prefill_tiling``. ``route`` (one of ``ROUTES``) picks
    the kernel; None: ``long_prefill_route``'s choice when no tiling argument is given, else this
    module's kernel. "flash_sdpa" takes one fresh prompt only, "tma" what ``tma_prefill_fits``.
    ``heavy_first``: query tiles launched latest first (module docstring).
    ``flat_tiles``: one grid axis over the query tiles of all sequences together (as many
    programs as ``tokens`` need plus one per sequence) instead of ``max_seqlen_q``'s tiles for
    every sequence: a CUDA graph's launch, whose ``max_seqlen_q`` bounds every one of many
    sequence slots, most of them empty. Each program computes what it computes on the other
    grid.
    """
    tuned = (block_rows, block_n, num_warps, num_stages, heavy_first) != (None,) * 5
    tiling = prefill_tiling(max_seqlen_q, k_cache is not None)
    block_rows = tiling["block_rows"] if block_rows is None else block_rows
    block_n = tiling["block_n"] if block_n is None else block_n
    num_warps = tiling["num_warps"] if num_warps is None else num_warps
    num_stages = tiling["num_stages"] if num_stages is None else num_stages
    heavy_first = bool(tiling["heavy_first"]) if heavy_first is None else heavy_first
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[1]
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"{num_heads} query heads do not divide into {num_kv_heads} KV heads")
    paged = k_cache is not None
    if paged and (v_cache is None or block_tables is None):
        raise ValueError("paged prefill needs v_cache and block_tables as well as k_cache")
    if out is None:
        out = torch.empty_like(q)
    num_seqs = context_lens.shape[0]
    if num_seqs == 0 or max_seqlen_q == 0:
        return out
    if route is None:
        route = "triton" if tuned else long_prefill_route(q, k, v, num_seqs, max_seqlen_q,
                                                          k_cache, v_cache, flat_tiles)
    if route not in ROUTES:
        raise ValueError(f"unknown prefill attention route {route!r}; one of {ROUTES}")
    if route == "flash_sdpa":
        if paged or num_seqs != 1 or q.shape[0] != max_seqlen_q:
            raise ValueError("the flash SDPA route takes one prompt with fresh keys only")
        return flash_sdpa_prefill(q, k, v, scale, out)
    if route == "tma":
        from engine.model.kernels.prefill_attention_tma import (
            TMA_PAGED_TILING,
            tma_prefill_attention,
            tma_prefill_fits,
        )

        if flat_tiles or not tma_prefill_fits(q, k, v, k_cache, v_cache, TMA_PAGED_TILING[1]):
            raise ValueError("the TMA route takes eager half-precision launches on compute "
                             "capability 9+ with 2-D-viewable Q/K/V (tma_prefill_fits)")
        return tma_prefill_attention(q, k, v, cu_seqlens_q, context_lens, max_seqlen_q, scale,
                                     out, k_cache, v_cache, block_tables)
    group = num_heads // num_kv_heads
    tile_tokens = max(1, block_rows // group)
    if paged:
        assert v_cache is not None and block_tables is not None
        k_src, v_src, table = k_cache, v_cache, block_tables
        block_size = k_cache.shape[1]
        cache_strides = (k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("the KV caches must be contiguous")
    else:
        k_src, v_src, table = k, v, context_lens  # table unused when not paged
        block_size = 1
        cache_strides = (0, 0, 0)
        if k.stride(-1) != 1 or v.stride(-1) != 1:
            raise ValueError("k and v must be contiguous in their last dimension")
    if flat_tiles:
        grid: tuple[int, ...] = (triton.cdiv(q.shape[0], tile_tokens) + num_seqs, num_kv_heads)
    else:
        grid = (triton.cdiv(max_seqlen_q, tile_tokens), num_seqs, num_kv_heads)
    _prefill_kernel[grid](
        q,
        k_src,
        v_src,
        table,
        cu_seqlens_q,
        context_lens,
        out,
        num_seqs,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        table.stride(0) if paged else 0,
        *cache_strides,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(MIN_DOT_ROWS, triton.next_power_of_2(head_dim)),
        GROUP=group,
        BLOCK_ROWS=block_rows,
        TILE_TOKENS=tile_tokens,
        BLOCK_N=block_n,
        PAGED=paged,
        IEEE=q.dtype == torch.float32,
        HEAVY_FIRST=heavy_first,
        FLAT_SLOTS=triton.next_power_of_2(num_seqs) if flat_tiles else 0,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_options(),
    )
    return out
