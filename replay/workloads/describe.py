"""``replayllm workload describe``: what a workload holds, in one streaming pass.

Requests and conversations, time span and rate over time (of the arrivals a file states: first
turns), prompt and output length distributions, and the share of prompt tokens an unlimited
prefix cache would serve at a block size: a full block of a prompt whose chained hash (the
engine's own, ``engine.block_hash.chain_hash``) an earlier prompt already had. A later turn
of a conversation reuses the previous turn's whole context (prompt and answer, the answer taken
as ``max_tokens`` long); its own new tokens are new.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from engine.block_hash import NO_HASH, chain_hash
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import Request

RATE_BINS = 10
QUANTILES = (0.5, 0.9, 0.99)


class PrefixReuse:
    """Counts prompt tokens an unlimited prefix cache of ``block_size`` blocks would serve."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.seen: set[int] = set()
        self.served = 0

    def add_recipe(self, recipe: PromptRecipe) -> None:
        """As ``add(recipe.tokens())``, without making the tokens (``PromptRecipe.block_keys``)."""
        self._count(recipe.block_keys(self.block_size).tolist())

    def _count(self, keys: list[int]) -> None:
        seen = self.seen
        for key in keys:
            if key in seen:
                self.served += self.block_size
            else:
                seen.add(key)

    def add(self, tokens: np.ndarray) -> None:
        """Count the full blocks of a prompt given as tokens (the engine's chained hashes)."""
        block = self.block_size
        parent = NO_HASH
        for start in range(0, len(tokens) - block + 1, block):
            parent = chain_hash(tokens[start:start + block], parent, 0)  # type: ignore[arg-type]
            if parent in self.seen:
                self.served += block
            else:
                self.seen.add(parent)


@dataclass
class WorkloadSummary:
    """Everything ``describe`` reports (lengths as arrays: one number per request)."""

    requests: int = 0
    conversations: int = 0
    later_turns: int = 0
    text_prompts: int = 0
    block_size: int = 0
    arrivals: np.ndarray = field(default_factory=lambda: np.zeros(0))
    prompt_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    output_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    prompt_tokens: int = 0
    served_tokens: int = 0

    @property
    def span_s(self) -> float:
        return float(self.arrivals.max() - self.arrivals.min()) if len(self.arrivals) else 0.0

    @property
    def reuse(self) -> float:
        """Share of prompt tokens an unlimited prefix cache would serve."""
        return self.served_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def rate_over_time(self, bins: int = RATE_BINS) -> list[tuple[float, float, float]]:
        """(bin start s, bin end s, first-turn arrivals per second) over the span."""
        if not len(self.arrivals) or self.span_s == 0:
            return []
        counts, edges = np.histogram(self.arrivals, bins=bins)
        width = edges[1] - edges[0]
        return [(float(a), float(b), float(c / width))
                for a, b, c in zip(edges[:-1], edges[1:], counts)]


def summarize(requests: Iterable[Request], block_size: int) -> WorkloadSummary:
    """One pass over ``requests`` (a stream: only per-request numbers are kept)."""
    reuse = PrefixReuse(block_size)
    chunks: dict[str, list[np.ndarray]] = {"arrivals": [], "prompt": [], "output": []}
    buffers: dict[str, list[float]] = {"arrivals": [], "prompt": [], "output": []}
    context: dict[str, int] = {}  # conversation -> tokens of its last turn's prompt and answer
    out = WorkloadSummary(block_size=block_size)

    def flush() -> None:
        for key, values in buffers.items():
            if values:
                chunks[key].append(np.asarray(values))
                values.clear()

    for request in requests:
        out.requests += 1
        conversation = request.conversation_id
        buffers["output"].append(request.max_tokens)
        if request.follows_previous_turn:
            out.later_turns += 1
        else:
            buffers["arrivals"].append(request.arrival_s)
            out.conversations += 1
        prompt = request.prompt
        if isinstance(prompt, str):
            out.text_prompts += 1
            context.pop(conversation or "", None)
            continue
        before = context.get(conversation, 0) if request.follows_previous_turn else 0
        length = before + len(prompt)
        buffers["prompt"].append(length)
        out.prompt_tokens += length
        reuse.served += before // block_size * block_size
        if not before and isinstance(prompt, PromptRecipe):
            reuse.add_recipe(prompt)
        elif not before:
            reuse.add(np.asarray(prompt, dtype=np.int32))
        if conversation is not None:
            context[conversation] = length + request.max_tokens
        if len(buffers["output"]) >= 65536:
            flush()
    flush()

    def joined(key: str, dtype: type) -> np.ndarray:
        return np.concatenate(chunks[key]).astype(dtype) if chunks[key] else np.zeros(0, dtype)

    out.arrivals = joined("arrivals", float)
    out.prompt_lens = joined("prompt", np.int64)
    out.output_lens = joined("output", np.int64)
    out.served_tokens = reuse.served
    return out


def _number(value: float, decimals: int = 3) -> str:
    """``value`` with thousands separators, or in scientific notation outside [0.001, 1e12)
    (a workload imported with ``--time-scale 1e-300`` has rates of 300 digits)."""
    if value == 0 or 1e-3 <= abs(value) < 1e12:
        return f"{value:,.{decimals}f}"
    return f"{value:.3e}"


def _quantiles(values: np.ndarray) -> str:
    if not len(values):
        return "-"
    qs = np.quantile(values, QUANTILES)
    return (f"mean {values.mean():,.1f}  p50 {qs[0]:,.0f}  p90 {qs[1]:,.0f}  p99 {qs[2]:,.0f}  "
            f"max {values.max():,}  total {int(values.sum()):,}")


def table(summary: WorkloadSummary) -> str:
    """The summary as an aligned text table."""
    rows = [
        ("requests", f"{summary.requests:,}"),
        ("conversations", f"{summary.conversations:,} ({summary.later_turns:,} later turns)"),
        ("time span", f"{_number(summary.span_s)} s (first-turn arrivals)"),
        ("mean rate", f"{_number((summary.conversations - 1) / summary.span_s)} req/s"
         if summary.span_s > 0 else "- (all at once)"),
        ("prompt tokens", _quantiles(summary.prompt_lens)),
        ("output tokens", _quantiles(summary.output_lens)),
        (f"prefix reuse @{summary.block_size}",
         f"{100 * summary.reuse:.1f}% of prompt tokens an unlimited prefix cache would serve"),
    ]
    if summary.text_prompts:
        rows.append(("text prompts", f"{summary.text_prompts:,} (lengths unknown until "
                     "tokenized: not counted above)"))
    lines = [f"{name:<22} {value}" for name, value in rows]
    rates = summary.rate_over_time()
    if rates:
        lines.append("rate over time")
        lines += [f"  {_number(a, 1):>12} - {_number(b, 1):>12} s  {_number(r):>10} req/s"
                  for a, b, r in rates]
    return "\n".join(lines)
