"""Which fused Triton kernels a model's layers use: state of one model, chosen when it is built.

Layers ask their :class:`FusedKernels` for ``module``; ``None`` means "use the PyTorch code",
which is always the path on CPU. ``Config.fused_kernels = False`` turns the fused kernels off on
CUDA too, ``Config.fused_kv_store = False`` only the KV store inside ``qk_norm_rope``,
``Config.split_k_gemm = False`` the split-K decode GEMMs of ``layers/decode_gemm.py``;
``Config.decode_gemm_prefetch`` picks their table with weight prefetch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from types import ModuleType

import torch

from engine.model.layers.decode_gemm import DECODE_TILINGS, Buckets, decode_tilings


@dataclass
class FusedKernels:
    """The fused kernels of one model, shared by all its layers.

    ``module``: ``engine.model.kernels.fused``, or None (every layer runs its PyTorch code).
    ``kv_store``: ``qk_norm_rope`` may also write K/V to the cache (where the backend allows).
    ``split_k``: ``engine.model.kernels.skinny_gemm`` (decode-sized ``o_proj``/``down`` GEMMs,
    their partials summed by the following RMSNorm), or None (cuBLAS for every projection).
    ``decode_tilings``: the table of their tilings (``decode_gemm.decode_tilings``).
    The first fused store compiles that variant (``store_checked``); if it fails, the store is
    turned off for this model (``store_usable``), with a warning, rather than failing the run.
    """

    module: ModuleType | None = None
    kv_store: bool = True
    split_k: ModuleType | None = None
    decode_tilings: dict[str, Buckets] = field(default_factory=lambda: DECODE_TILINGS)
    store_checked: bool = False
    store_usable: bool = True

    def store_failed(self, exc: Exception) -> None:
        """The fused store could not compile: warn once and store K/V with ``store_kv``."""
        self.store_usable = False
        warnings.warn(
            f"fused KV store unavailable ({type(exc).__name__}: {exc}); "
            "storing K/V with store_kv instead",
            RuntimeWarning,
            stacklevel=3,
        )


def load_fused_kernels(
    device: torch.device | str,
    enabled: bool = True,
    kv_store: bool = True,
    split_k: bool = True,
    prefetch: bool = False,
) -> FusedKernels:
    """The fused kernels a model on ``device`` uses: the Triton modules on CUDA when ``enabled``
    (the split-K GEMMs also when ``split_k``, from the prefetching table with ``prefetch``) and
    triton imports, else none (the PyTorch code serves)."""
    module: ModuleType | None = None
    split_k_module: ModuleType | None = None
    if enabled and torch.device(device).type == "cuda":
        try:
            from engine.model.kernels import fused as module
            from engine.model.kernels import skinny_gemm
        except ImportError:  # no triton: the PyTorch code serves
            module = None
        else:
            split_k_module = skinny_gemm if split_k else None
    return FusedKernels(module, kv_store, split_k_module, decode_tilings(prefetch))
