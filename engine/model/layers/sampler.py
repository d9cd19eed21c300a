"""Token sampling: greedy at temperature 0, otherwise from softmax(logits / T), seeded.

Rows with per-request options (top-p, top-k, a request's own seed) take a per-row PyTorch path
(``sample_option_rows``) on any device; the others are batched (here on CPU, in the Triton
kernel on CUDA).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

# (top_p, top_k, seed, index of the completion token being sampled): a row's per-request options
# (``Sequence.row_sampling`` plus its index); None for a row the batched path serves.
RowOptions = tuple[float, int, int, int]
NO_SEED = -1  # tracing.schema.NO_SEED: the row draws from the sampler's generator
# Mixes a request's seed with a token's index into that token's generator seed.
SEED_STRIDE = 1_000_003
SEED_MASK = 2**63 - 1


def row_options(seqs: Sequence) -> list[RowOptions | None] | None:
    """Per-row options of the sampled sequences ``seqs`` (None: no row has any). A token's index
    counts the completion tokens before it, so a seeded request's draws never depend on what
    it was batched with, on preemptions or on when its steps ran."""
    if not any(seq.row_sampling is not None for seq in seqs):
        return None
    return [
        None if seq.row_sampling is None
        else (*seq.row_sampling, seq.num_tokens - seq.num_prompt_tokens)
        for seq in seqs
    ]


def _filtered(logits: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """``logits`` (one row, float32, already divided by T) with tokens outside the top-k and
    the nucleus set to -inf (the most likely token always stays)."""
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above each one
        drop = before >= top_p
        drop[0] = False
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


def sample_option_rows(
    logits: torch.Tensor,
    temperatures: Sequence[float] | torch.Tensor,
    options: Sequence[RowOptions | None],
    tokens: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Overwrite ``tokens[i]`` for each row ``i`` with options by a draw of its own (in place).

    A row with a seed draws from a generator seeded by (seed, token index); one without draws
    from ``generator``. Exponential race on the filtered softmax, as ``Sampler`` does.
    """
    if isinstance(temperatures, torch.Tensor):
        temperatures = temperatures.tolist()
    for i, option in enumerate(options):
        if option is None:
            continue
        top_p, top_k, seed, index = option
        row = _filtered(logits[i].float() / float(temperatures[i]), top_p, top_k)
        probs = torch.softmax(row, dim=-1)
        source = generator
        if seed != NO_SEED:
            source = torch.Generator(device=logits.device)
            source.manual_seed((seed * SEED_STRIDE + index) & SEED_MASK)
        noise = torch.empty_like(probs).exponential_(1.0, generator=source)
        tokens[i] = (probs / noise).argmax()
    return tokens


class Sampler(nn.Module):
    """One token per row of ``logits``.

    Stochastic rows use the exponential-race trick (``argmax(p / E)`` with ``E ~ Exp(1)`` is a
    draw from ``p``), with noise from this sampler's own ``torch.Generator``: the same seed and
    the same sequence of batches give the same tokens. Greedy rows draw no noise, so a greedy run
    leaves the generator untouched. Rows with ``options`` go through ``sample_option_rows``.
    """

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def forward(
        self,
        logits: torch.Tensor,
        temperatures: Sequence[float],
        options: Sequence[RowOptions | None] | None = None,
    ) -> torch.Tensor:
        if logits.shape[0] != len(temperatures):
            raise ValueError(
                f"{logits.shape[0]} rows of logits but {len(temperatures)} temperatures"
            )
        if options is not None and len(options) != len(temperatures):
            raise ValueError(f"{len(options)} row options for {len(temperatures)} rows")
        logits = logits.float()
        tokens = logits.argmax(dim=-1)
        rows = [
            i for i, t in enumerate(temperatures)
            if t > 0 and (options is None or options[i] is None)
        ]
        if rows:
            index = torch.tensor(rows, device=logits.device)
            temps = torch.tensor(
                [temperatures[i] for i in rows], dtype=torch.float32, device=logits.device
            )
            probs = torch.softmax(logits[index] / temps[:, None], dim=-1)
            noise = torch.empty_like(probs).exponential_(1.0, generator=self.generator)
            tokens[index] = (probs / noise).argmax(dim=-1)
        if options is not None:
            sample_option_rows(logits, temperatures, options, tokens, self.generator)
        return tokens
