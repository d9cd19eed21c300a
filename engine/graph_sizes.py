"""Which prefills run through CUDA graphs, padded to which token count (no torch: the what-if
simulator applies the same rule on any machine).

Captured token counts: powers of two from ``MIN_GRAPH_TOKENS`` to ``FINE_GRAPH_TOKENS``, then
every ``COARSE_GRAPH_STEP`` up to ``Config.prefill_graph_tokens`` (and the token budget), so
padding wastes at most half of a small prefill and a quarter of a large one. Each graph takes up
to ``MAX_GRAPH_PREFILL_SEQS`` sequences (``engine/runner/prefill_graphs.py`` captures and replays them).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.config import Config

MIN_GRAPH_TOKENS = 16
FINE_GRAPH_TOKENS = 1024
COARSE_GRAPH_STEP = 512
MAX_GRAPH_PREFILL_SEQS = 16


def prefill_graph_sizes(limit: int) -> list[int]:
    """The token counts captured for prefills of up to ``limit`` tokens (empty: ``limit`` is
    below the smallest)."""
    sizes = []
    size = MIN_GRAPH_TOKENS
    while size <= min(limit, FINE_GRAPH_TOKENS):
        sizes.append(size)
        size *= 2
    size = FINE_GRAPH_TOKENS + COARSE_GRAPH_STEP
    while size <= limit:
        sizes.append(size)
        size += COARSE_GRAPH_STEP
    return sizes


def padded_prefill_tokens(sizes: Sequence[int], tokens: int, num_seqs: int,
                          max_seqs: int = MAX_GRAPH_PREFILL_SEQS) -> int:
    """The captured token count a prefill of ``tokens`` tokens over ``num_seqs`` sequences pads
    to; 0: it runs eager (too many tokens or sequences)."""
    if num_seqs > max_seqs or num_seqs < 1:
        return 0
    for size in sizes:
        if size >= tokens:
            return size
    return 0


def prefill_graph_limit(config: Config) -> int:
    """The largest prefill ``config`` lets a CUDA graph take: ``prefill_graph_tokens`` within
    the token budget (the engine captures none above either); 0 under ``enforce_eager``."""
    if config.enforce_eager:
        return 0
    return min(config.prefill_graph_tokens, config.max_num_batched_tokens)
