"""Triton kernels of the sampler variants the engine does not use (the experiment of
:mod:`benchmarks.sampler_variants`).

- ``_sample_chunk_kernel``: the reference structure, a 2-D grid of (row, chunk) programs, each
  writing the best (score, column) of its chunk (Philox noise from ``tl.rand4x``);
- ``_sample_tiles_kernel``: the engine's structure (``engine.model.kernels.sampler``) with every
  option: Philox or hash noise, pruning, and a finish by PyTorch, by ``_finish_kernel``, by the
  last program of each row (atomic), or direct when a row has one split;
- ``_noise_kernel`` and ``gumbel_probe``: hooks that expose the noise (tests and benchmarks).

The jit helpers shared with the engine's kernel are imported by name from it: a kernel reads
globals (jit helpers, ``tl.constexpr``) from its own module.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.model.kernels.sampler import (
    INT32_MAX,
    INTERPRETING,
    LOG2E,
    _best_of,
    _gumbel2,
    _keep_best,
    _philox_noise,
    _scores,
    _uniform,
)

# u is drawn in [0, 1); keep -log(u) finite and positive so -log(-log(u)) never produces NaN.
MIN_UNIFORM = tl.constexpr(1e-20)
# Largest noise -log2(MIN_EXPONENTIAL) = 25, plus a margin for the approximate log2.
MAX_NOISE = tl.constexpr(25.01)
# Hash constants, all below 2**31 so that they stay 32-bit in uint32 arithmetic.
HASH_ROW = tl.constexpr(0x2545F491)
HASH_KEY2 = tl.constexpr(0x6A09E667)

# The NOISE constexpr of the tiles kernels.
NOISE_NONE = 0
NOISE_PHILOX = 1
NOISE_HASH = 2
# The FINISH constexpr of the tiles kernel.
FINISH_TORCH = 0
FINISH_KERNEL = 1
FINISH_ATOMIC = 2
FINISH_DIRECT = 3  # one split per row: the program writes the token


@triton.jit
def _mix32(x):
    """lowbias32 (C. Wellons' hash prospector): a well-mixing bijection of uint32."""
    x ^= x >> 16
    x *= 0x21F0AAAD
    x ^= x >> 15
    x *= 0x735A2D97
    x ^= x >> 15
    return x


@triton.jit
def _tile_noise(
    seed_lo,
    seed_hi,
    row,
    group,
    cols0,
    quarter,
    NOISE: tl.constexpr,
    ROUNDS: tl.constexpr,
    TAIL: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    """Noise of the four quarters ``cols0 + i * quarter`` of a tile (shape of ``cols0``).

    Philox: the engine's noise. Hash: one word per column from (seed, row, column). ``row`` may
    be a scalar or a tensor that broadcasts against ``cols0``.
    """
    if NOISE == 1:
        n0, n1, n2, n3 = _philox_noise(seed_lo, seed_hi, row, group, ROUNDS, TAIL, FAST_LOG)
    else:
        k0 = seed_lo.to(tl.uint32)
        k1 = seed_hi.to(tl.uint32)
        # Row key: bijective in the row for a given seed; the second key makes two rows whose
        # first keys differ by less than the vocabulary size still draw unrelated words.
        key1 = _mix32(_mix32(row.to(tl.uint32) * HASH_ROW + k1) ^ k0)
        r0 = _mix32(cols0.to(tl.uint32) + key1)
        r1 = _mix32((cols0 + quarter).to(tl.uint32) + key1)
        r2 = _mix32((cols0 + 2 * quarter).to(tl.uint32) + key1)
        r3 = _mix32((cols0 + 3 * quarter).to(tl.uint32) + key1)
        if ROUNDS >= 2:
            key2 = _mix32(key1 + HASH_KEY2)
            r0 = _mix32(r0 ^ key2)
            r1 = _mix32(r1 ^ key2)
            r2 = _mix32(r2 ^ key2)
            r3 = _mix32(r3 ^ key2)
        n0 = _gumbel2(_uniform(r0), TAIL, FAST_LOG)
        n1 = _gumbel2(_uniform(r1), TAIL, FAST_LOG)
        n2 = _gumbel2(_uniform(r2), TAIL, FAST_LOG)
        n3 = _gumbel2(_uniform(r3), TAIL, FAST_LOG)
    return n0, n1, n2, n3


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


# --- the tiles kernel with every option ---------------------------------------------------------


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


# --- hooks that expose the noise ----------------------------------------------------------------


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _noise_kernel(
    out_ptr,
    seed_lo,
    seed_hi,
    num_rows,
    vocab,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NOISE: tl.constexpr,
    ROUNDS: tl.constexpr,
    TAIL: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    """Test hook: the noise a tiles kernel adds to each (row, column), ``[rows, vocab]``."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
    t = tl.program_id(1) * BLOCK_V
    quarter: tl.constexpr = BLOCK_V // 4
    lanes = tl.arange(0, quarter)[None, :]
    cols0 = t + lanes
    group = t // 4 + lanes + rows * 0  # full [BLOCK_ROWS, quarter]: Philox words stay 2-D
    n0, n1, n2, n3 = _tile_noise(
        seed_lo, seed_hi, rows, group, cols0, quarter, NOISE, ROUNDS, TAIL, FAST_LOG
    )
    base = out_ptr + rows.to(tl.int64) * vocab
    row_ok = rows < num_rows
    tl.store(base + cols0, n0, mask=row_ok & (cols0 < vocab))
    tl.store(base + cols0 + quarter, n1, mask=row_ok & (cols0 + quarter < vocab))
    tl.store(base + cols0 + 2 * quarter, n2, mask=row_ok & (cols0 + 2 * quarter < vocab))
    tl.store(base + cols0 + 3 * quarter, n3, mask=row_ok & (cols0 + 3 * quarter < vocab))


PROBE_MODES = {"ref": 0, "tiles": 1, "tiles-notail": 2, "tiles-fastlog": 3, "log2": 4}


@triton.jit
def _gumbel_probe_kernel(u_ptr, out_ptr, n, BLOCK: tl.constexpr, MODE: tl.constexpr):
    """Diagnostics: the noise each formula gives for chosen uniforms (``PROBE_MODES``)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    u = tl.load(u_ptr + offs, mask=ok, other=0.5)
    if MODE == 0:  # the reference kernel's formula
        g = -tl.log2(-tl.log2(tl.maximum(u, MIN_UNIFORM)))
    elif MODE == 1:
        g = _gumbel2(u, True, False)
    elif MODE == 2:
        g = _gumbel2(u, False, False)
    elif MODE == 3:
        g = _gumbel2(u, True, True)
    else:  # the raw exponential -log2(u): is it ever <= 0 below 1?
        g = -tl.log2(u)
    tl.store(out_ptr + offs, g, mask=ok)


def gumbel_probe(u: torch.Tensor, mode: str) -> torch.Tensor:
    """float32 noise of float32 uniforms ``u`` by formula ``mode`` (tests and benchmarks)."""
    code = PROBE_MODES[mode]
    if code == 3 and INTERPRETING:
        raise ValueError("fast_log2f needs a compiled kernel")
    u = u.float().contiguous()
    out = torch.empty_like(u)
    block = 1024
    grid = (triton.cdiv(u.numel(), block),)
    _gumbel_probe_kernel[grid](u, out, u.numel(), BLOCK=block, MODE=code)
    return out
