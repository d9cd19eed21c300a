"""Activation of the SwiGLU MLP."""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` for an input laid out as ``[gate | up]`` on the last dimension.

    ``fused``: the fused kernels module (``FusedKernels.module``), or None for the PyTorch code.
    """

    def __init__(self, fused: ModuleType | None = None) -> None:
        super().__init__()
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:  # CUDA: one launch, no intermediate silu(gate) tensor
            return self.fused.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
