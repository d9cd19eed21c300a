"""How the paged decode-attention kernel is launched for a batch: the splits it cuts each
context into and the tiling it reads keys with (torch-free, so that the what-if's step-time
model prices a decode by the same split rule the kernel runs:
``engine/model/kernels/paged_attention.py``)."""

from __future__ import annotations

from dataclasses import dataclass

# Aim for at least this many programs per launch (a few per multiprocessor) when choosing how
# many splits to cut each context into; more splits only add merge work.
TARGET_PROGRAMS = 1024
MAX_SPLITS = 16


def choose_num_splits(num_seqs: int, num_kv_heads: int) -> int:
    """Splits per context so that a launch has about ``TARGET_PROGRAMS`` programs.

    A power of two, so only a handful of kernel variants (the split count is a compile-time
    constant) are ever compiled.
    """
    programs = max(1, num_seqs * num_kv_heads)
    wanted = -(-TARGET_PROGRAMS // programs)
    return min(MAX_SPLITS, 1 << (wanted - 1).bit_length())


@dataclass(frozen=True)
class DecodeTiling:
    """Keys per inner-loop tile, warps and software-pipeline stages of one decode launch."""

    block_n: int
    num_warps: int
    num_stages: int


# ``Config.decode_attention_tiling``: "fixed" is one tiling for every batch (the traces recorded
# before the field); "by_batch" switches to WIDE_TILING from WIDE_TILING_MIN_SEQS rows, where
# the H200 sweep (benchmarks/decode_attention.py, docs/BENCHMARKS.md) read KV 1-3% faster with
# 128-key tiles in two stages; below it 64-key tiles in three stages were as fast or faster.
DECODE_TILING_RULES = ("fixed", "by_batch")
FIXED_TILING = DecodeTiling(block_n=64, num_warps=4, num_stages=3)
WIDE_TILING = DecodeTiling(block_n=128, num_warps=4, num_stages=2)
WIDE_TILING_MIN_SEQS = 96


def decode_tiling(num_seqs: int, rule: str) -> DecodeTiling:
    """The tiling of a decode launch over ``num_seqs`` rows under ``rule``."""
    if rule not in DECODE_TILING_RULES:
        raise ValueError(f"decode tiling rule {rule!r}: choose {', '.join(DECODE_TILING_RULES)}")
    if rule == "by_batch" and num_seqs >= WIDE_TILING_MIN_SEQS:
        return WIDE_TILING
    return FIXED_TILING


def launch_variants(max_batch: int, num_kv_heads: int, rule: str) -> list[int]:
    """One batch size in ``[1, max_batch]`` per distinct (split count, tiling) launch: running
    them compiles every kernel variant a decode of up to ``max_batch`` rows can use."""
    seen: dict[tuple[int, DecodeTiling], int] = {}
    for batch in range(1, max_batch + 1):
        key = (choose_num_splits(batch, num_kv_heads), decode_tiling(batch, rule))
        seen.setdefault(key, batch)
    return sorted(seen.values())
