"""Whether a layer may use the fused Triton kernels: only for CUDA tensors, and only with triton.

Layers ask :func:`fused_kernels` with their input; ``None`` means "use the PyTorch code", which
is always the path on CPU. ``REPLAYLLM_FUSED_KERNELS=0`` turns the fused kernels off on CUDA too
(for A/B comparisons of numerics or speed).
"""

from __future__ import annotations

import os
from types import ModuleType

import torch

ENV_SWITCH = "REPLAYLLM_FUSED_KERNELS"
_state: dict[str, ModuleType | None] = {}


def fused_kernels(x: torch.Tensor) -> ModuleType | None:
    """The ``engine.model.kernels.fused`` module when ``x`` is on CUDA and it can run, else None."""
    if not x.is_cuda:
        return None
    if "module" not in _state:
        module: ModuleType | None = None
        if os.environ.get(ENV_SWITCH, "1") != "0":
            try:
                from engine.model.kernels import fused as module
            except ImportError:  # no triton: the PyTorch code serves
                module = None
        _state["module"] = module
    return _state["module"]
