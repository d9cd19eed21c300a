"""Which fused Triton kernels a model's layers use: state of one model, chosen when it is built.

Layers ask their :class:`FusedKernels` for ``module``; ``None`` means "use the PyTorch code",
which is always the path on CPU. ``Config.fused_kernels = False`` turns the fused kernels off on
CUDA too, ``Config.fused_kv_store = False`` only the KV store inside ``qk_norm_rope``,
``Config.split_k_gemm = False`` the split-K decode GEMMs of ``layers/decode_gemm.py``;
``Config.decode_gemm_prefetch`` picks their table with weight prefetch;
``Config.decode_qk_prologue`` moves QK-norm, RoPE and the K/V store of decode-only steps into
the decode attention kernel.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar

import torch

from engine.config import Config
from engine.model.layers.decode_gemm import DECODE_TILINGS, Buckets, decode_tilings

if TYPE_CHECKING:
    from engine.model.layers.attention import Attention

T = TypeVar("T")


@dataclass
class TriedVariant:
    """A kernel variant tried on its first call (which compiles it, outside any CUDA-graph
    capture) and turned off for its model, with a warning, if that call raises, rather than
    failing the run; its caller then takes the plain path. ``what`` names the variant and
    ``instead`` the plain path, for the warning."""

    what: str
    instead: str
    usable: bool = True
    checked: bool = False

    def call(self, launch: Callable[[], T]) -> T | None:
        """``launch()``'s result, or None when the variant is off or its first call failed."""
        if not self.usable:
            return None
        if self.checked:
            return launch()
        try:
            result = launch()
        except Exception as exc:  # noqa: BLE001 - the caller falls back to the plain path
            self.failed(exc)
            return None
        self.checked = True
        return result

    def failed(self, exc: Exception) -> None:
        """The variant could not run: warn and turn it off."""
        self.usable = False
        warnings.warn(
            f"{self.what} unavailable ({type(exc).__name__}: {exc}); {self.instead}",
            RuntimeWarning,
            stacklevel=3,
        )


@dataclass
class FusedKernels:
    """The fused kernels of one model, shared by all its layers.

    ``module``: ``engine.model.kernels.fused``, or None (every layer runs its PyTorch code).
    ``kv_store``: ``qk_norm_rope`` may also write K/V to the cache (where the backend allows).
    ``split_k``: ``engine.model.kernels.skinny_gemm`` (decode-sized ``o_proj``/``down`` GEMMs,
    their partials summed by the following RMSNorm), or None (cuBLAS for every projection).
    ``decode_tilings``: the table of their tilings (``decode_gemm.decode_tilings``).
    ``decode_qk_prologue``: a decode-only step's attention starts from the QKV rows, its
    kernel applying QK-norm and RoPE and storing K/V (where the backend allows).
    ``store`` and ``prologue``: the fused store's and the prologue's first-call checks.
    """

    module: ModuleType | None = None
    kv_store: bool = True
    split_k: ModuleType | None = None
    decode_tilings: dict[str, Buckets] = field(default_factory=lambda: DECODE_TILINGS)
    decode_qk_prologue: bool = False
    store: TriedVariant = field(
        default_factory=lambda: TriedVariant(
            "fused KV store", "storing K/V with store_kv instead"
        )
    )
    prologue: TriedVariant = field(
        default_factory=lambda: TriedVariant(
            "decode QK prologue", "running qk_norm_rope before the decode kernel instead"
        )
    )

    def decodes_from_qkv(self, attention: Attention) -> bool:
        """Whether ``attention``'s decode-only steps start from the QKV rows: the fused kernels
        are loaded with ``decode_qk_prologue``, its first call has not failed, and the layer's
        backend and caches allow it. Depends on no tensor value: graph-capture safe."""
        return (
            self.module is not None
            and self.decode_qk_prologue
            and self.prologue.usable
            and attention.decodes_from_qkv()
        )


def load_fused_kernels(
    device: torch.device | str,
    *,
    enabled: bool,
    kv_store: bool,
    split_k: bool,
    prefetch: bool,
    decode_qk_prologue: bool,
) -> FusedKernels:
    """The fused kernels a model on ``device`` uses: the Triton modules on CUDA when ``enabled``
    (the split-K GEMMs also when ``split_k``, from the prefetching table with ``prefetch``) and
    triton imports, else none (the PyTorch code serves). ``decode_qk_prologue``: see
    :class:`FusedKernels`."""
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
    return FusedKernels(
        module, kv_store, split_k_module, decode_tilings(prefetch), decode_qk_prologue
    )


def kernels_for(config: Config, device: torch.device | str) -> FusedKernels:
    """The fused kernels ``config``'s kernel settings ask for on ``device``: the one reading of
    those settings, for the runner and for a model built without a runner (``Config()``'s
    defaults, so a test or benchmark runs the kernels the engine runs)."""
    return load_fused_kernels(
        device,
        enabled=config.fused_kernels,
        kv_store=config.fused_kv_store,
        split_k=config.split_k_gemm,
        prefetch=config.decode_gemm_prefetch,
        decode_qk_prologue=config.decode_qk_prologue,
    )
