"""The GPU sampler's noise: uniforms and base-2 Gumbel noise as Triton jit helpers.

The sampling kernels (:mod:`engine.model.kernels.sampler_kernels`) add this noise to the scaled
logits: ``G2 = -log2(-log2 U)``, ``U`` from Philox-4x32 (``NOISE_PHILOX``) or an integer hash of
(seed, row, column) (``NOISE_HASH``). Also here: two diagnostic kernels that expose the noise
(``_noise_kernel`` for the tests, ``gumbel_probe`` for tests and benchmarks). The constants are
``tl.constexpr`` globals, the only kind of global a compiled kernel may read; a module whose
kernels use them imports them by name.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

# Triton's interpreter (CPU tests) has no libdevice: fast_log falls back to tl.log2 there.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"

# u is drawn in [0, 1); keep -log(u) finite and positive so -log(-log(u)) never produces NaN.
# A tl.constexpr: the only kind of global a compiled kernel may read.
MIN_UNIFORM = tl.constexpr(1e-20)
LOG2E = tl.constexpr(1.4426950408889634)
# Tiles kernels. U = (2k + 1) * 2**-24 from the top 23 bits k of a random word: 1 + k * 2**-23
# (exponent bits OR-ed in) minus 1 - 2**-24, exact in float32 (Sterbenz).
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
# Hash constants, all below 2**31 so that they stay 32-bit in uint32 arithmetic.
HASH_ROW = tl.constexpr(0x2545F491)
HASH_KEY2 = tl.constexpr(0x6A09E667)

# The NOISE constexpr of the tiles kernels.
NOISE_NONE = 0
NOISE_PHILOX = 1
NOISE_HASH = 2


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

    Philox: counter (``group``, row, 0, 0), key (seed_lo, seed_hi); word ``i`` is quarter ``i``.
    Hash: one word per column from (seed, row, column). ``row`` may be a scalar or a tensor that
    broadcasts against ``cols0`` (the tests draw many rows in one program).
    """
    k0 = seed_lo.to(tl.uint32)
    k1 = seed_hi.to(tl.uint32)
    if NOISE == 1:
        c0 = group.to(tl.uint32)
        zero = c0 * 0
        c1 = zero + row.to(tl.uint32)
        r0, r1, r2, r3 = tl.philox_impl(c0, c1, zero, zero, k0, k1, ROUNDS)
    else:
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
