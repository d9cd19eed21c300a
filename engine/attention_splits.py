"""How the paged decode-attention kernel cuts each context into splits (torch-free, so that the
what-if's step-time model prices a decode by the same rule the kernel runs:
``engine/model/kernels/paged_attention.py``)."""

from __future__ import annotations

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


def decode_grid(num_seqs: int, num_kv_heads: int, num_splits: int,
                heads_fastest: bool = True) -> tuple[int, int, int]:
    """The decode kernel's launch grid: the row (the order's position, with rows longest first)
    on the slowest axis, so every program of a row launches before any of the next row's and a
    long row's splits all start in the first wave; KV heads (or splits) fastest."""
    if heads_fastest:
        return (num_kv_heads, num_splits, num_seqs)
    return (num_splits, num_kv_heads, num_seqs)
