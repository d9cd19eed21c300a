"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from engine.model.layers.decode_gemm import SplitKParts


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)``, statistics in float32.

    ``forward(x, residual)`` first forms ``residual = x + residual`` (in the activation dtype, as
    Hugging Face does, so bf16 results round the same way), normalizes it and returns
    ``(normalized, residual)`` for the next block. ``fused``: the fused kernels module
    (``FusedKernels.module``), or None for the PyTorch code. ``x`` may be a projection's split-K
    partials (:class:`SplitKParts`, with a residual): they are summed first, in order.
    """

    def __init__(
        self, hidden_size: int, eps: float = 1e-6, fused: ModuleType | None = None
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.fused = fused
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        variance = xf.pow(2).mean(-1, keepdim=True)
        return self.weight * (xf * torch.rsqrt(variance + self.eps)).to(dtype)

    def forward(
        self, x: torch.Tensor | SplitKParts, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if isinstance(x, SplitKParts):
            if self.fused is None or residual is None:
                raise ValueError("split-K partials need the fused norm and a residual")
            return self.fused.rms_norm_of_parts(x.parts, self.weight, self.eps, residual)
        if self.fused is not None:  # CUDA: one launch instead of several (same rounding points)
            return self.fused.rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        residual = x + residual
        return self._norm(residual), residual

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
