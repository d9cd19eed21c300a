"""Token sampling: greedy at temperature 0, otherwise from softmax(logits / T), seeded."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class Sampler(nn.Module):
    """One token per row of ``logits``.

    Stochastic rows use the exponential-race trick (``argmax(p / E)`` with ``E ~ Exp(1)`` is a
    draw from ``p``), with noise from this sampler's own ``torch.Generator``: the same seed and
    the same sequence of batches give the same tokens. Greedy rows draw no noise, so a greedy run
    leaves the generator untouched.
    """

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def forward(self, logits: torch.Tensor, temperatures: Sequence[float]) -> torch.Tensor:
        if logits.shape[0] != len(temperatures):
            raise ValueError(
                f"{logits.shape[0]} rows of logits but {len(temperatures)} temperatures"
            )
        logits = logits.float()
        tokens = logits.argmax(dim=-1)
        rows = [i for i, t in enumerate(temperatures) if t > 0]
        if not rows:
            return tokens
        index = torch.tensor(rows, device=logits.device)
        temps = torch.tensor(
            [temperatures[i] for i in rows], dtype=torch.float32, device=logits.device
        )
        probs = torch.softmax(logits[index] / temps[:, None], dim=-1)
        noise = torch.empty_like(probs).exponential_(1.0, generator=self.generator)
        tokens[index] = (probs / noise).argmax(dim=-1)
        return tokens
