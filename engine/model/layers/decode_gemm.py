"""Which decode-sized projections run through the split-K kernel, and with which tiling.

``engine/model/kernels/skinny_gemm.py`` computes ``x W^T`` for a batch of decode rows with the
weight's rows as the MMA's wide side and K split over programs. The tilings below were chosen
by ``python -m benchmarks.skinny_gemm`` on an H200 (figures: docs/BENCHMARKS.md); a shape or
batch they do not cover keeps cuBLAS.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SplitKTiling:
    """One launch shape: ``block_n`` weight rows x ``block_m`` batch rows per program, K in
    ``split_k`` slices walked ``block_k`` at a time."""

    block_n: int = 64
    block_m: int = 64
    block_k: int = 128
    split_k: int = 2
    num_warps: int = 4
    num_stages: int = 3

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
            f"w{self.num_warps}p{self.num_stages}"
        )
