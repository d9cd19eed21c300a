"""Which steps run through CUDA graphs, padded to which size: the one rule, torch-free.

The runner captures graphs by these rules (``engine/runner``) and the what-if simulator pads its
steps by the same ones on any machine (``replay/whatif``).

Decodes: graphs for batch sizes 1, 2, 4, 8, then every ``GRAPH_SIZE_STEP`` up to
``min(max_num_seqs, MAX_GRAPH_BATCH)`` (Nano-vLLM's choice); a decode pads to the smallest
captured size that holds it, and a larger one runs eager.

Prefills: token counts that are powers of two from ``MIN_GRAPH_TOKENS`` to ``FINE_GRAPH_TOKENS``,
then every ``COARSE_GRAPH_STEP`` up to ``Config.prefill_graph_tokens`` (and the token budget), so
padding wastes at most half of a small prefill and a quarter of a large one. Each graph takes up
to ``Config.prefill_graph_seqs`` sequences.

Mixed steps: graphs per (prefill tokens, decode rows), the prefill part padded to the prefill
graphs' token counts up to ``MAX_MIXED_GRAPH_TOKENS`` (each count multiplies the decode
capacities, so fewer) over up to ``MIXED_GRAPH_PREFILL_SEQS`` sequences.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.config import Config
from engine.policy import policy_class

SMALL_GRAPH_SIZES = (1, 2, 4, 8)
GRAPH_SIZE_STEP = 16
MAX_GRAPH_BATCH = 512  # the largest decode batch captured in a CUDA graph (Nano-vLLM's)

MIN_GRAPH_TOKENS = 16
FINE_GRAPH_TOKENS = 1024
COARSE_GRAPH_STEP = 512
MIXED_GRAPH_PREFILL_SEQS = 16
MAX_MIXED_GRAPH_TOKENS = 4096
# The sequences a prefill graph took before Config.prefill_graph_seqs (traces of that engine).
LEGACY_PREFILL_GRAPH_SEQS = 16


def decode_graph_sizes(max_batch: int = MAX_GRAPH_BATCH) -> list[int]:
    """The decode batch sizes captured for batches of up to ``max_batch`` sequences."""
    max_batch = min(max_batch, MAX_GRAPH_BATCH)
    sizes = [s for s in SMALL_GRAPH_SIZES if s <= max_batch]
    sizes += list(range(GRAPH_SIZE_STEP, max_batch + 1, GRAPH_SIZE_STEP))
    return sizes


def padded_decode_size(sizes: Sequence[int], batch: int) -> int:
    """The smallest of ``sizes`` (ascending) that holds ``batch`` rows; 0: none, it runs eager."""
    for size in sizes:
        if size >= batch:
            return size
    return 0


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
                          max_seqs: int) -> int:
    """The captured token count a prefill of ``tokens`` tokens over ``num_seqs`` sequences pads
    to; 0: it runs eager (too many tokens or sequences)."""
    if num_seqs > max_seqs or num_seqs < 1:
        return 0
    return padded_decode_size(sizes, tokens)


def prefill_graph_limit(config: Config) -> int:
    """The largest prefill ``config`` lets a CUDA graph take: ``prefill_graph_tokens`` within
    the token budget (the engine captures none above either); 0 under ``enforce_eager``."""
    if config.enforce_eager:
        return 0
    return min(config.prefill_graph_tokens, config.max_num_batched_tokens)


def prefill_graph_prompts(config: Config) -> int:
    """The most prompts one of ``config``'s prefill graphs takes: ``prefill_graph_seqs``, and no
    more than its largest token count holds (0: no prefill graphs)."""
    sizes = prefill_graph_sizes(prefill_graph_limit(config))
    return min(config.prefill_graph_seqs, sizes[-1]) if sizes else 0


def mixed_prefill_sizes(prefill_sizes: Sequence[int]) -> list[int]:
    """The prefill graphs' token counts a mixed step's prompt part may pad to."""
    return [size for size in prefill_sizes if size <= MAX_MIXED_GRAPH_TOKENS]


# Decode capacities captured: few, since each multiplies the prefill token counts; padding a
# decode part costs GEMM rows only (padding rows read no KV).
MIXED_DECODE_SIZES = (32, 128, 256, 512)


def mixed_decode_sizes(max_batch: int) -> list[int]:
    """The decode capacities captured for batches of up to ``max_batch`` decodes (the largest
    is ``max_batch`` itself, so every decode count that fits the engine has one)."""
    sizes = [d for d in MIXED_DECODE_SIZES if d < max_batch]
    return [*sizes, max_batch] if max_batch >= 1 else []


def mixed_graph_decode_sizes(config: Config) -> list[int]:
    """The decode capacities of the mixed-step graphs a runner under ``config`` captures beside
    its prefill graphs; empty where its policy never schedules prompt chunks beside decodes."""
    if not policy_class(config.policy).mixed_batches:
        return []
    return mixed_decode_sizes(min(config.max_num_seqs, MAX_GRAPH_BATCH))


def mixed_graph_key(
    prefill_sizes: Sequence[int],
    decode_sizes: Sequence[int],
    prefill_tokens: int,
    num_prefill_seqs: int,
    num_decodes: int,
) -> tuple[int, int] | None:
    """The (padded prefill tokens, decode rows) graph a mixed step replays; None: it runs eager
    (too many tokens or sequences, or no decodes)."""
    if num_decodes < 1:
        return None
    tokens = padded_prefill_tokens(prefill_sizes, prefill_tokens, num_prefill_seqs,
                                   MIXED_GRAPH_PREFILL_SEQS)
    rows = padded_decode_size(decode_sizes, num_decodes)
    if not tokens or tokens > MAX_MIXED_GRAPH_TOKENS or not rows:
        return None
    return tokens, rows
