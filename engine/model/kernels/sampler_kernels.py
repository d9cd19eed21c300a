"""The GPU sampler's Triton kernels: each writes the Gumbel-max token, or partial bests, of rows.

- ``_sample_chunk_kernel``: the reference structure, a 2-D grid of (row, chunk) programs, each
  writing the best (score, column) of its chunk (Philox noise from ``tl.rand4x``);
- ``_sample_tiles_kernel``: a grid of (row, split) programs, each looping over tiles of its span
  with a per-lane running best; finished (``FINISH_*``) by PyTorch, by ``_finish_kernel``, by
  the last program of each row, or directly when a row has one split.

The noise comes from :mod:`engine.model.kernels.sampler_noise`; the host side (variants, grids,
buffers) is :mod:`engine.model.kernels.sampler`.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Imported by name: a kernel reads globals (jit helpers, tl.constexpr) from its own module.
from engine.model.kernels.sampler_noise import LOG2E, MIN_UNIFORM, _tile_noise

# Largest noise -log2(MIN_EXPONENTIAL) = 25, plus a margin for the approximate log2.
MAX_NOISE = tl.constexpr(25.01)
INT32_MAX = tl.constexpr(2147483647)

# --- the reference kernel ----------------------------------------------------------------------


@triton.jit
def _quarter_best(row_ptr, cols, vocab, scale, gain, u, HAS_NOISE: tl.constexpr):
    """Best (score, column) of one quarter chunk: score = logit * scale + gain * Gumbel."""
    ok = cols < vocab
    x = tl.load(row_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_NOISE:
        # -log2(-log2 u) is a standard Gumbel draw scaled by 1/ln 2 (shifted by a constant), and
        # scale = log2(e) / T puts the logits on the same base-2 scale: the argmax is unchanged.
        noise = -tl.log2(-tl.log2(tl.maximum(u, MIN_UNIFORM)))
        score = tl.where(ok, x * scale + gain * noise, float("-inf"))
    else:
        score = tl.where(ok, x * scale, float("-inf"))
    best, idx = tl.max(score, 0, return_indices=True, return_indices_tie_break_left=True)
    return best, tl.min(cols, 0) + idx


@triton.jit
def _take_later(best, idx, cand, cand_idx):
    """Keep the earlier column on ties (columns are visited in increasing order)."""
    take = cand > best
    return tl.where(take, cand, best), tl.where(take, cand_idx, idx)


# Values that change from step to step must not trigger a recompile.
@triton.jit(do_not_specialize=["seed"])
def _sample_chunk_kernel(
    logits_ptr,
    temps_ptr,
    best_val_ptr,
    best_idx_ptr,
    seed,
    logits_stride,
    vocab,
    num_chunks,
    BLOCK_V: tl.constexpr,
    ROUNDS: tl.constexpr = 10,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    quarter: tl.constexpr = BLOCK_V // 4
    lanes = tl.arange(0, quarter)
    # One Philox call gives four uniforms: one per quarter of the chunk.
    if ROUNDS > 0:
        u0, u1, u2, u3 = tl.rand4x(seed, (row * num_chunks + chunk) * quarter + lanes, ROUNDS)
    else:  # no noise at all: the greedy floor of this kernel's structure
        u0 = tl.zeros([quarter], tl.float32)
        u1 = u0
        u2 = u0
        u3 = u0
    has_noise: tl.constexpr = ROUNDS > 0
    temp = tl.load(temps_ptr + row)
    sampled = temp > 0
    scale = tl.where(sampled, LOG2E / tl.where(sampled, temp, 1.0), 1.0)
    gain = tl.where(sampled, 1.0, 0.0)  # greedy rows: the plain argmax
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    base = chunk * BLOCK_V + lanes
    best, idx = _quarter_best(row_ptr, base, vocab, scale, gain, u0, has_noise)
    cand, cand_idx = _quarter_best(row_ptr, base + quarter, vocab, scale, gain, u1, has_noise)
    best, idx = _take_later(best, idx, cand, cand_idx)
    cand, cand_idx = _quarter_best(row_ptr, base + 2 * quarter, vocab, scale, gain, u2, has_noise)
    best, idx = _take_later(best, idx, cand, cand_idx)
    cand, cand_idx = _quarter_best(row_ptr, base + 3 * quarter, vocab, scale, gain, u3, has_noise)
    best, idx = _take_later(best, idx, cand, cand_idx)
    out = row * num_chunks + chunk
    tl.store(best_val_ptr + out, best)
    tl.store(best_idx_ptr + out, idx)


# --- the tiles kernels: sampling ---------------------------------------------------------------

FINISH_TORCH = 0
FINISH_KERNEL = 1
FINISH_ATOMIC = 2
FINISH_DIRECT = 3  # one split per row: the program writes the token


@triton.jit
def _scores(row_ptr, cols, vocab, scale):
    ok = cols < vocab
    x = tl.load(row_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    return tl.where(ok, x * scale, float("-inf"))


@triton.jit
def _keep_best(best, best_col, score, cols):
    """Per lane: a strictly better score replaces the best (so the earliest column wins ties)."""
    take = score > best
    return tl.where(take, score, best), tl.where(take, cols, best_col)


@triton.jit
def _best_of(values, cols):
    """(max, lowest column holding it) of a vector."""
    top = tl.max(values, 0)
    return top, tl.min(tl.where(values == top, cols, INT32_MAX), 0)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _sample_tiles_kernel(
    logits_ptr,
    temps_ptr,
    part_val_ptr,
    part_idx_ptr,
    out_ptr,
    count_ptr,
    seed_lo,
    seed_hi,
    logits_stride,
    vocab,
    span,
    BLOCK_V: tl.constexpr,
    NOISE: tl.constexpr,
    ROUNDS: tl.constexpr,
    TAIL: tl.constexpr,
    FAST_LOG: tl.constexpr,
    PRUNE: tl.constexpr,
    FINISH: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    quarter: tl.constexpr = BLOCK_V // 4
    lanes = tl.arange(0, quarter)
    temp = tl.load(temps_ptr + row)
    sampled = temp > 0
    scale = tl.where(sampled, LOG2E / tl.where(sampled, temp, 1.0), 1.0)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    lo = split * span
    hi = tl.minimum(lo + span, vocab)
    best = tl.full([quarter], float("-inf"), tl.float32)
    best_col = tl.zeros([quarter], tl.int32) + lo
    best_score = tl.max(best, 0)  # -inf: the best noisy score so far (PRUNE)
    for t in range(lo, hi, BLOCK_V):
        cols0 = t + lanes
        s0 = _scores(row_ptr, cols0, vocab, scale)
        s1 = _scores(row_ptr, cols0 + quarter, vocab, scale)
        s2 = _scores(row_ptr, cols0 + 2 * quarter, vocab, scale)
        s3 = _scores(row_ptr, cols0 + 3 * quarter, vocab, scale)
        if NOISE != 0:
            if PRUNE:
                # No column of this tile can beat the best so far: its noise is not needed, and
                # its noiseless scores stay below that best, so they never win either.
                tile_top = tl.max(tl.maximum(tl.maximum(s0, s1), tl.maximum(s2, s3)), 0)
                need = sampled & (tile_top + MAX_NOISE > best_score)
            else:
                need = sampled
            if need:  # greedy rows draw no noise
                n0, n1, n2, n3 = _tile_noise(
                    seed_lo,
                    seed_hi,
                    row,
                    t // 4 + lanes,
                    cols0,
                    quarter,
                    NOISE,
                    ROUNDS,
                    TAIL,
                    FAST_LOG,
                )
                s0 += n0
                s1 += n1
                s2 += n2
                s3 += n3
                if PRUNE:
                    noisy_top = tl.max(tl.maximum(tl.maximum(s0, s1), tl.maximum(s2, s3)), 0)
                    best_score = tl.maximum(best_score, noisy_top)
        best, best_col = _keep_best(best, best_col, s0, cols0)
        best, best_col = _keep_best(best, best_col, s1, cols0 + quarter)
        best, best_col = _keep_best(best, best_col, s2, cols0 + 2 * quarter)
        best, best_col = _keep_best(best, best_col, s3, cols0 + 3 * quarter)
    top, top_col = _best_of(best, best_col)
    if FINISH == 3:
        tl.store(out_ptr + row, top_col.to(tl.int64))
    else:
        part = row * num_splits + split
        tl.store(part_val_ptr + part, top)
        tl.store(part_idx_ptr + part, top_col)
        if FINISH == 2:
            # The last program of the row to arrive reduces the row's partials. Scalar stores and
            # atomics run in one thread of the program, so the release of this add publishes the
            # stores above; the last program reads through L2 (.cg) after its acquire.
            arrived = tl.atomic_add(count_ptr + row, 1, sem="acq_rel")
            last = arrived == num_splits - 1
            offs = tl.arange(0, SPLITS_PAD)
            live = (offs < num_splits) & last
            base = row * num_splits + offs
            vals = tl.load(
                part_val_ptr + base, mask=live, other=float("-inf"), cache_modifier=".cg"
            )
            idxs = tl.load(part_idx_ptr + base, mask=live, other=INT32_MAX, cache_modifier=".cg")
            _, win = _best_of(vals, idxs)
            tl.store(out_ptr + row, win.to(tl.int64), mask=last)
            tl.store(count_ptr + row, 0, mask=last)  # ready for the next call


@triton.jit
def _finish_kernel(part_val_ptr, part_idx_ptr, out_ptr, num_splits, SPLITS_PAD: tl.constexpr):
    """Token of each row from its splits' (best score, column): the lowest column on ties."""
    row = tl.program_id(0)
    offs = tl.arange(0, SPLITS_PAD)
    ok = offs < num_splits
    base = row * num_splits + offs
    vals = tl.load(part_val_ptr + base, mask=ok, other=float("-inf"))
    idxs = tl.load(part_idx_ptr + base, mask=ok, other=INT32_MAX)
    _, win = _best_of(vals, idxs)
    tl.store(out_ptr + row, win.to(tl.int64))
