"""Token sampling on the GPU in one pass over the logits (Triton, Gumbel-max).

``argmax(logits / T + G)`` with ``G`` standard Gumbel noise is a draw from ``softmax(logits /
T)``, so no softmax, no normalisation and no float32 copy of the logits are needed: each program
reads its span of bf16 logits once and keeps the best (score, column) per lane. Rows with ``T ==
0`` are greedy (no noise). The noise is counter-based: the same ``seed`` gives the same tokens.

This is one variant of the sampler, :data:`SAMPLER_VARIANT` (``tiles-p7-fastlog``); the others,
and the measurements that chose this one, are an experiment in ``benchmarks/sampler_variants.py``
(see docs/gpu-notes.md). Its structure: a grid of (row, split) programs, each looping over tiles
of ``BLOCK_V`` columns of its span of the vocabulary with a per-lane running best, skipping the
noise of greedy rows, finished by a second tiny kernel (or by the program itself when a row has
one split). Noise: Philox-4x32 with 7 rounds (one call serves four columns), base-2 logs through
the hardware's fast ``log2`` (the interpreter has none and uses ``tl.log2``), and a series for
``-log2(u)`` near ``u = 1``.

It draws exactly ``argmax(logits * log2(e) / T + G2)`` with ``G2 = -log2(-log2 U)`` (a base-2
Gumbel: the same argmax as the natural-log form), ``U`` a float in ``[2**-24, 1 - 2**-24]``; ties
go to the lowest column, greedy rows are the plain argmax with the same tie rule.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from engine.model.kernels.gdc import gdc_enter
from engine.model.kernels.launch import pdl_options

__all__ = ["SAMPLER_VARIANT", "sample_tokens", "sampler_noise", "split_plan", "warm_up_sampler"]

# The variant's name in benchmarks/sampler_variants.py; the trace header records it.
SAMPLER_VARIANT = "tiles-p7-fastlog"
SAMPLE_BLOCK_V = 4096
SAMPLE_NUM_WARPS = 8
PHILOX_ROUNDS = 7
# Programs the kernel aims for (rows x splits): a few per SM of a large GPU.
TILES_TARGET_PROGRAMS = 1024
FINISH_KERNEL = 1
FINISH_DIRECT = 3  # one split per row: the program writes the token
# Triton's interpreter (CPU tests) has no libdevice: fast_log falls back to tl.log2 there.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"

# tl.constexpr globals: the only kind of global a compiled kernel may read; a module whose
# kernels use them imports them by name.
LOG2E = tl.constexpr(1.4426950408889634)
# U = (2k + 1) * 2**-24 from the top 23 bits k of a random word: 1 + k * 2**-23 (exponent bits
# OR-ed in) minus 1 - 2**-24, exact in float32 (Sterbenz).
ONE_MINUS_HALF_ULP = tl.constexpr(0.99999994039535522)  # 1 - 2**-24
ONE_BITS = tl.constexpr(0x3F800000)
# -log2(u) for u near 1 from its series in w = 1 - u (exact): w * log2(e) * (1 + w/2 + w^2/3),
# relative error below w^3/4 = 2**-20 for w < 2**-6; the hardware log2 has an absolute error
# of ~2**-22 there, which is all of -log2(u) when u = 1 - 2**-24.
TAIL_W = tl.constexpr(0.015625)
LOG2E_2 = tl.constexpr(0.7213475204444817)
LOG2E_3 = tl.constexpr(0.48089834696298783)
# The smallest -log2(u) kept (the true smallest is -log2(1 - 2**-24) = 8.6e-8): a guard against
# a non-positive approximate log, so the noise is never +inf or NaN.
MIN_EXPONENTIAL = tl.constexpr(2.9802322387695312e-08)  # 2**-25
INT32_MAX = tl.constexpr(2147483647)


@triton.jit
def _uniform(bits):
    """uint32 -> float32 (2k + 1) * 2**-24 in [2**-24, 1 - 2**-24], k the top 23 bits."""
    one_plus = ((bits >> 9) | ONE_BITS).to(tl.float32, bitcast=True)  # 1 + k * 2**-23
    return one_plus - ONE_MINUS_HALF_ULP


@triton.jit
def _log2(x, FAST_LOG: tl.constexpr):
    if FAST_LOG:  # lg2.approx through libdevice (compiled kernels only)
        y = libdevice.fast_log2f(x)
    else:
        y = tl.log2(x)
    return y


@triton.jit
def _gumbel2(u, TAIL: tl.constexpr, FAST_LOG: tl.constexpr):
    """Base-2 Gumbel noise -log2(-log2 u): finite for every u in (0, 1)."""
    e = -_log2(u, FAST_LOG)
    if TAIL:
        w = 1.0 - u  # exact for u >= 1/2
        series = w * (LOG2E + w * (LOG2E_2 + w * LOG2E_3))
        e = tl.where(w < TAIL_W, series, e)
    e = tl.maximum(e, MIN_EXPONENTIAL)
    return -_log2(e, FAST_LOG)


@triton.jit
def _philox_noise(seed_lo, seed_hi, row, group, ROUNDS: tl.constexpr, TAIL: tl.constexpr,
                  FAST_LOG: tl.constexpr):
    """Noise of the four quarters of a tile: Philox counter (``group``, row, 0, 0), key
    (seed_lo, seed_hi); word ``i`` is quarter ``i``. ``row`` may be a scalar or a tensor that
    broadcasts against ``group`` (the noise hook draws many rows in one program)."""
    k0 = seed_lo.to(tl.uint32)
    k1 = seed_hi.to(tl.uint32)
    c0 = group.to(tl.uint32)
    zero = c0 * 0
    c1 = zero + row.to(tl.uint32)
    r0, r1, r2, r3 = tl.philox_impl(c0, c1, zero, zero, k0, k1, ROUNDS)
    n0 = _gumbel2(_uniform(r0), TAIL, FAST_LOG)
    n1 = _gumbel2(_uniform(r1), TAIL, FAST_LOG)
    n2 = _gumbel2(_uniform(r2), TAIL, FAST_LOG)
    n3 = _gumbel2(_uniform(r3), TAIL, FAST_LOG)
    return n0, n1, n2, n3


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
def _sample_kernel(
    logits_ptr,
    temps_ptr,
    part_val_ptr,
    part_idx_ptr,
    out_ptr,
    seed_lo,
    seed_hi,
    logits_stride,
    vocab,
    span,
    BLOCK_V: tl.constexpr,
    ROUNDS: tl.constexpr,
    FAST_LOG: tl.constexpr,
    FINISH: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    """Program (row, split): the best noisy score of its span, or the row's token (direct)."""
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
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
    for t in range(lo, hi, BLOCK_V):
        cols0 = t + lanes
        s0 = _scores(row_ptr, cols0, vocab, scale)
        s1 = _scores(row_ptr, cols0 + quarter, vocab, scale)
        s2 = _scores(row_ptr, cols0 + 2 * quarter, vocab, scale)
        s3 = _scores(row_ptr, cols0 + 3 * quarter, vocab, scale)
        if sampled:  # greedy rows draw no noise
            n0, n1, n2, n3 = _philox_noise(
                seed_lo, seed_hi, row, t // 4 + lanes, ROUNDS, True, FAST_LOG
            )
            s0 += n0
            s1 += n1
            s2 += n2
            s3 += n3
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


# ``num_splits`` follows the batch size: specialised (== 1, multiples of 16) or sized into
# ``SPLITS_PAD`` it would compile a kernel the first time each batch size came up in a run,
# ~75 ms on the engine thread (docs/gpu-notes.md, session 18).
@triton.jit(do_not_specialize=["num_splits"])
def _finish_kernel(
    part_val_ptr, part_idx_ptr, out_ptr, num_splits, SPLITS_PAD: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    """Token of each row from its splits' (best score, column): the lowest column on ties."""
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    row = tl.program_id(0)
    offs = tl.arange(0, SPLITS_PAD)
    ok = offs < num_splits
    base = row * num_splits + offs
    vals = tl.load(part_val_ptr + base, mask=ok, other=float("-inf"))
    idxs = tl.load(part_idx_ptr + base, mask=ok, other=INT32_MAX)
    _, win = _best_of(vals, idxs)
    tl.store(out_ptr + row, win.to(tl.int64))


@triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
def _noise_kernel(
    out_ptr,
    seed_lo,
    seed_hi,
    num_rows,
    vocab,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    ROUNDS: tl.constexpr,
    FAST_LOG: tl.constexpr,
    USE_GDC: tl.constexpr,
):
    """Test hook: the noise ``_sample_kernel`` adds to each (row, column), ``[rows, vocab]``."""
    gdc_enter(USE_GDC)  # programmatic dependent launch: kernels/launch.py
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
    t = tl.program_id(1) * BLOCK_V
    quarter: tl.constexpr = BLOCK_V // 4
    lanes = tl.arange(0, quarter)[None, :]
    cols0 = t + lanes
    group = t // 4 + lanes + rows * 0  # full [BLOCK_ROWS, quarter]: Philox words stay 2-D
    n0, n1, n2, n3 = _philox_noise(seed_lo, seed_hi, rows, group, ROUNDS, True, FAST_LOG)
    base = out_ptr + rows.to(tl.int64) * vocab
    row_ok = rows < num_rows
    tl.store(base + cols0, n0, mask=row_ok & (cols0 < vocab))
    tl.store(base + cols0 + quarter, n1, mask=row_ok & (cols0 + quarter < vocab))
    tl.store(base + cols0 + 2 * quarter, n2, mask=row_ok & (cols0 + 2 * quarter < vocab))
    tl.store(base + cols0 + 3 * quarter, n3, mask=row_ok & (cols0 + 3 * quarter < vocab))


def split_plan(
    rows: int, vocab: int, block_v: int, target_programs: int, splits: int | None = None
) -> tuple[int, int]:
    """(splits per row, columns per split, a multiple of ``block_v``) for the tiles kernel."""
    tiles = triton.cdiv(vocab, block_v)
    if splits is None:
        splits = triton.cdiv(target_programs, max(rows, 1))
    splits = max(1, min(splits, tiles))
    span = triton.cdiv(tiles, splits) * block_v
    return triton.cdiv(vocab, span), span


def seed_halves(seed: int) -> tuple[int, int]:
    """Two 31-bit halves: both fit int32, so the kernel signature never changes with the seed."""
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    return seed & 0x7FFFFFFF, (seed >> 31) & 0x7FFFFFFF


def sample_tokens(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seed: int,
    block_v: int | None = None,
    *,
    splits: int | None = None,
) -> torch.Tensor:
    """One token id (int64) per row of ``logits`` ``[rows, vocab]``; ``temperatures`` float32.

    ``block_v`` and ``splits`` override the tile width and the splits per row (tests).
    """
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if temperatures.shape != (rows,):
        raise ValueError(f"{rows} rows of logits but temperatures {tuple(temperatures.shape)}")
    block_v = block_v or SAMPLE_BLOCK_V
    if rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    device = logits.device
    num_splits, span = split_plan(rows, vocab, block_v, TILES_TARGET_PROGRAMS, splits)
    finish = FINISH_DIRECT if num_splits == 1 else FINISH_KERNEL
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    if finish == FINISH_DIRECT:
        part_val = part_idx = tokens  # unused
    else:
        part_val = torch.empty(rows, num_splits, dtype=torch.float32, device=device)
        part_idx = torch.empty(rows, num_splits, dtype=torch.int32, device=device)
    seed_lo, seed_hi = seed_halves(seed)
    _sample_kernel[(rows, num_splits)](
        logits,
        temperatures,
        part_val,
        part_idx,
        tokens,
        seed_lo,
        seed_hi,
        logits.stride(0),
        vocab,
        span,
        BLOCK_V=block_v,
        ROUNDS=PHILOX_ROUNDS,
        FAST_LOG=not INTERPRETING,
        FINISH=finish,
        num_warps=SAMPLE_NUM_WARPS,
        **pdl_options(),
    )
    if finish == FINISH_KERNEL:
        pad = triton.next_power_of_2(triton.cdiv(vocab, block_v))  # the most splits a row has
        _finish_kernel[(rows,)](
            part_val, part_idx, tokens, num_splits, SPLITS_PAD=pad, **pdl_options()
        )
    return tokens


def warm_up_sampler(vocab: int, device: torch.device | str) -> None:
    """Compile every kernel variant :func:`sample_tokens` launches for a vocabulary of
    ``vocab`` (one split per row, several splits and the finishing kernel) on one row, so no
    batch size of a run compiles one on the engine thread."""
    logits = torch.zeros(1, vocab, dtype=torch.bfloat16, device=device)
    temps = torch.ones(1, dtype=torch.float32, device=device)
    sample_tokens(logits, temps, 0, splits=1)
    sample_tokens(logits, temps, 0, splits=2)


def sampler_noise(
    rows: int,
    vocab: int,
    seed: int,
    block_v: int | None = None,
    device: torch.device | str = "cpu",
    max_block: int = 8192,
) -> torch.Tensor:
    """The base-2 Gumbel noise :func:`sample_tokens` adds at each (row, column): float32
    ``[rows, vocab]`` (for tests: the sampler must equal ``argmax(logits * log2(e) / T +
    noise)``). One program draws a tile for up to ``max_block // (block_v / 4)`` rows at once.
    """
    block_v = block_v or SAMPLE_BLOCK_V
    out = torch.empty(rows, vocab, dtype=torch.float32, device=device)
    seed_lo, seed_hi = seed_halves(seed)
    block_rows = max(1, min(triton.next_power_of_2(rows), max_block // (block_v // 4)))
    grid = (triton.cdiv(rows, block_rows), triton.cdiv(vocab, block_v))
    _noise_kernel[grid](
        out,
        seed_lo,
        seed_hi,
        rows,
        vocab,
        BLOCK_ROWS=block_rows,
        BLOCK_V=block_v,
        ROUNDS=PHILOX_ROUNDS,
        FAST_LOG=not INTERPRETING,
        **pdl_options(),
    )
    return out
