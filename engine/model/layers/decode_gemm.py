"""Which decode-sized projections run through the split-K kernel, and with which tiling.

``engine/model/kernels/skinny_gemm.py`` computes ``x W^T`` for a batch of decode rows with the
weight's rows as the MMA's wide side and K split over programs. The tilings below were chosen
by ``python -m benchmarks.skinny_gemm`` on an H200 (figures: docs/BENCHMARKS.md); a shape or
batch they do not cover keeps cuBLAS.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch


@dataclass(frozen=True)
class SplitKTiling:
    """One launch shape: ``block_n`` weight rows x ``block_m`` batch rows per program, K in
    ``split_k`` slices walked ``block_k`` at a time. ``prefetch``: each program first asks L2
    for its weight slice, before it waits for the kernel before it (programmatic launch)."""

    block_n: int = 64
    block_m: int = 64
    block_k: int = 128
    split_k: int = 2
    num_warps: int = 4
    num_stages: int = 3
    prefetch: bool = False

    def fits(self, m: int, n: int, k: int) -> bool:
        """Whether this tiling covers an ``[m, k] x [k, n]`` product exactly along N and K."""
        return (
            m <= self.block_m * 65535
            and n % self.block_n == 0
            and k % (self.split_k * self.block_k) == 0
        )

    def label(self) -> str:
        return (
            f"n{self.block_n}m{self.block_m}k{self.block_k}s{self.split_k}"
            f"w{self.num_warps}p{self.num_stages}" + ("f" if self.prefetch else "")
        )


@dataclass(frozen=True)
class SplitKParts:
    """A projection's output as ``[split_k, rows, N]`` float32 partials, not yet summed: only
    :class:`~engine.model.layers.layernorm.RMSNorm` with a residual consumes it (it sums them)."""

    parts: torch.Tensor


Buckets = tuple[tuple[int, SplitKTiling], ...]

# Tilings per projection, by the largest batch (rows) each serves, from the H200 sweep of
# benchmarks/skinny_gemm.py (Qwen3-0.6B's o_proj K 2,048 and down K 3,072, N 1,024). Past the
# last bucket cuBLAS is faster: there the output has enough tiles of its own.
DECODE_TILINGS: dict[str, Buckets] = {
    "o_proj": (
        (16, SplitKTiling(64, 16, 128, 4, 4, 3)),
        (64, SplitKTiling(64, 32, 128, 4, 4, 3)),
        (128, SplitKTiling(64, 64, 128, 4, 4, 3)),
    ),
    "down": (
        (16, SplitKTiling(64, 16, 64, 8, 4, 4)),
        (64, SplitKTiling(128, 32, 128, 8, 4, 3)),
    ),
}
# With ``Config.decode_gemm_prefetch``: up to 16 rows every projection, qkv and gate_up included
# (one split: their output feeds no norm), runs a Triton tiling that prefetches its weights into
# L2 before waiting for the kernel before it (``SplitKTiling.prefetch``); past 16 rows the table
# above. From the sweep with ``--pdl --prefetch --layer`` (docs/gpu-notes.md, session 26): a
# layer's projections and norms at 1-16 rows 9-13% faster than with the table above; from 64
# rows prefetching gains nothing and Triton loses to cuBLAS for qkv and gate_up.
PREFETCH_ROWS = 16  # the largest batch whose tilings prefetch
PREFETCH_TILINGS: dict[str, Buckets] = {
    "qkv": ((PREFETCH_ROWS, SplitKTiling(64, 16, 128, 1, 4, 3, prefetch=True)),),
    "o_proj": (
        (PREFETCH_ROWS, SplitKTiling(64, 16, 64, 4, 4, 4, prefetch=True)),
        *DECODE_TILINGS["o_proj"][1:],
    ),
    "gate_up": ((PREFETCH_ROWS, SplitKTiling(64, 16, 128, 1, 4, 3, prefetch=True)),),
    "down": (
        (PREFETCH_ROWS, SplitKTiling(64, 16, 128, 8, 4, 3, prefetch=True)),
        *DECODE_TILINGS["down"][1:],
    ),
}
COLUMN_ROLES = ("qkv", "gate_up")  # their output feeds no norm: one split only


def decode_tilings(prefetch: bool) -> dict[str, Buckets]:
    """The tiling table of the decode GEMMs: with or without weight prefetch."""
    return PREFETCH_TILINGS if prefetch else DECODE_TILINGS


# The kernel accumulates in float32 from half-precision operands; float32 weights keep cuBLAS
# (Triton's dot would round them to TF32).
SPLIT_K_DTYPES = (torch.bfloat16, torch.float16)


def serves_dtype(dtype: torch.dtype) -> bool:
    """Whether the split-K kernel runs projections of this dtype (else cuBLAS does)."""
    return dtype in SPLIT_K_DTYPES


def split_k_batches(table: dict[str, Buckets] = DECODE_TILINGS) -> list[int]:
    """One batch size per tiling of ``table`` (the largest each serves): running them compiles
    them all."""
    return sorted({rows for buckets in table.values() for rows, _ in buckets})


class DecodeGemm:
    """The Triton GEMM choice of one projection of one model at decode batch sizes.

    ``kernel``: ``engine.model.kernels.skinny_gemm``; ``table``: :func:`decode_tilings`.
    :meth:`project` returns the product for a batch a tiling serves (split-K partials, or a
    tensor where the tiling has one split) and ``None`` for any other (the caller runs its
    cuBLAS path)."""

    def __init__(
        self, kernel: ModuleType, role: str, table: dict[str, Buckets] = DECODE_TILINGS
    ) -> None:
        if role not in table:
            raise ValueError(f"no decode tilings for {role!r}: choose {', '.join(table)}")
        self.kernel = kernel
        self.buckets = table[role]

    def tiling(self, rows: int, n: int, k: int) -> SplitKTiling | None:
        """The tiling of an ``[rows, k] x [k, n]`` product, or None (cuBLAS serves)."""
        for max_rows, tiling in self.buckets:
            if rows <= max_rows:
                return tiling if tiling.fits(rows, n, k) else None
        return None

    def project(
        self, x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False
    ) -> SplitKParts | torch.Tensor | None:
        """``x W^T`` (of ``silu(gate) * up`` with ``silu_mul``): partials, a tensor (one
        split), or None."""
        if not serves_dtype(x.dtype) or x.dim() != 2:
            return None
        n, k = weight.shape
        tiling = self.tiling(x.shape[0], n, k)
        if tiling is None:
            return None
        out = self.kernel.splitk_linear(x, weight, tiling, silu_mul=silu_mul)
        return SplitKParts(out) if tiling.split_k > 1 else out
