"""Rotary position embedding (NeoX layout: the two halves of each head form the pairs)."""

from __future__ import annotations

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to ``q`` ``[tokens, heads, head_dim]`` and ``k`` by absolute ``positions``.

    The cos/sin table is computed once for ``max_position`` positions, in float32 exactly as
    Hugging Face computes it (``base ** (2i/d)``, outer product, ``cos``/``sin``), so float32
    outputs agree bit for bit in the rotary step.
    """

    def __init__(self, head_dim: int, rotary_dim: int, max_position: int, base: float) -> None:
        super().__init__()
        if rotary_dim != head_dim:
            raise ValueError(
                f"partial rotary embeddings are not supported (rotary_dim {rotary_dim} != "
                f"head_dim {head_dim})"
            )
        self.head_dim = head_dim
        self.max_position = max_position
        self.base = base
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
        inv_freq = 1.0 / (base**exponents)
        positions = torch.arange(max_position, dtype=torch.int64).float()
        freqs = positions[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        # Not persistent: derived from the config, never read from a checkpoint.
        self.register_buffer("cos_cache", angles.cos(), persistent=False)
        self.register_buffer("sin_cache", angles.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos = self.cos_cache[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin_cache[positions].unsqueeze(1).to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_position={self.max_position}, base={self.base}"
