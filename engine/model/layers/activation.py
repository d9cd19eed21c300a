"""Activation of the SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.layers.cuda_kernels import fused_kernels


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` for an input laid out as ``[gate | up]`` on the last dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = fused_kernels(x)
        if kernels is not None:  # CUDA: one launch, no intermediate silu(gate) tensor
            return kernels.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
