"""The attention layer of the engine and the small interface its backends implement.

The layer owns nothing but its view of the paged KV cache; each step it stores the new K/V of
the whole batch through ``slot_mapping`` and then attends, so a sequence may read blocks that
another sequence of the same batch wrote in this very step (a prefix shared between two prompts
admitted together). Backends differ only in kernels: the PyTorch one (``attention_torch``) runs
anywhere; CUDA backends (Triton, flash-attn) register themselves with
:func:`register_attention_backend`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from engine.errors import ConfigError
from engine.model.attention_metadata import AttentionMetadata, QkNormRope


class AttentionBackend(Protocol):
    """Kernels for one attention layer; stateless, so one instance serves every layer.

    Tensors: ``q`` ``[num_tokens, num_heads, head_dim]``, ``k``/``v`` ``[num_tokens,
    num_kv_heads, head_dim]``, caches ``[num_blocks, block_size, num_kv_heads, head_dim]``.
    """

    name: str

    def store_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Write each token's K/V to its slot (``-1``: skip, a padding token)."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor | None,
        v_cache: torch.Tensor | None,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Causal attention of every query over its sequence's context; ``[num_tokens, H, D]``.

        With caches, keys/values are read from the cache (already holding this step's K/V);
        without (a profiling run), only whole prompts are allowed and the fresh K/V are used.
        """
        ...


@dataclass(frozen=True)
class _BackendEntry:
    factory: Callable[[], AttentionBackend]
    available: Callable[[torch.device], bool]
    why_unavailable: str


_BACKENDS: dict[str, _BackendEntry] = {}
# "auto" picks the first available of these, by device type.
_AUTO_ORDER = {"cuda": ("flash_attn", "triton", "torch"), "cpu": ("torch",)}


def register_attention_backend(
    name: str,
    factory: Callable[[], AttentionBackend],
    available: Callable[[torch.device], bool] = lambda device: True,
    why_unavailable: str = "",
) -> None:
    """Make a backend selectable by ``Config.attention_backend``."""
    _BACKENDS[name] = _BackendEntry(factory, available, why_unavailable)


def available_attention_backends(device: torch.device) -> list[str]:
    _ensure_builtin_backends()
    return [name for name, entry in _BACKENDS.items() if entry.available(device)]


def get_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    """The backend called ``name`` (or the best one for ``device`` when ``"auto"``)."""
    _ensure_builtin_backends()
    usable = available_attention_backends(device)
    if name == "auto":
        for candidate in _AUTO_ORDER.get(device.type, ("torch",)):
            if candidate in usable:
                return _BACKENDS[candidate].factory()
        raise ConfigError(f"no attention backend is available on device {device}")
    entry = _BACKENDS.get(name)
    if entry is None or name not in usable:
        reason = f" ({entry.why_unavailable})" if entry and entry.why_unavailable else ""
        raise ConfigError(
            f"attention backend {name!r} is not available on device {device}{reason}; "
            f"available: {', '.join(usable) or 'none'}"
        )
    return entry.factory()


def _ensure_builtin_backends() -> None:
    if "torch" not in _BACKENDS:
        from engine.model.layers.attention_flash import FlashAttnBackend, flash_attn_available
        from engine.model.layers.attention_torch import TorchAttentionBackend
        from engine.model.layers.attention_triton import TritonAttentionBackend, triton_available

        register_attention_backend("torch", TorchAttentionBackend)
        register_attention_backend(
            "triton", TritonAttentionBackend, triton_available, "needs CUDA and triton"
        )
        register_attention_backend(
            "flash_attn", FlashAttnBackend, flash_attn_available, "needs CUDA and flash-attn"
        )


class Attention(nn.Module):
    """Paged-KV attention of one layer: store new K/V, then attend through the backend.

    ``k_cache``/``v_cache`` are views into the runner's single KV tensor, bound by
    :meth:`bind_kv_cache`; until then (e.g. a profiling run) nothing is stored.

    The store may instead happen upstream, in the kernel that produces K and V: a model asks
    :meth:`fused_kv_store_target` for the caches, writes K/V there through
    ``metadata.slot_mapping`` (the layout and the ``-1`` rule of ``store_kv``) and calls
    ``forward(..., kv_stored=True)``. Only backends with ``supports_fused_kv_store = True``
    (whose ``store_kv`` is a plain slot write) and ``fuse_kv_store`` layers offer it.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        backend: AttentionBackend,
        fuse_kv_store: bool = True,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}"
            )
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.backend = backend
        self.fuse_kv_store = fuse_kv_store
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def bind_kv_cache(self, k_cache: torch.Tensor | None, v_cache: torch.Tensor | None) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache

    def fused_kv_store_target(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The caches an upstream kernel may write this step's K/V into, or None (then
        :meth:`forward` must store them). Depends on no tensor value: graph-capture safe."""
        if not self.fuse_kv_store or self.k_cache is None or self.v_cache is None:
            return None
        if not getattr(self.backend, "supports_fused_kv_store", False):
            return None
        return self.k_cache, self.v_cache

    def decodes_from_qkv(self) -> bool:
        """Whether :meth:`decode_from_qkv` can serve a decode-only step: the caches are bound
        and the backend's decode kernel can take QKV rows for this head size. Depends on no
        tensor value: graph-capture safe."""
        if self.k_cache is None or self.v_cache is None:
            return False
        fits = getattr(self.backend, "decodes_from_qkv", None)
        return fits is not None and fits(self.head_dim)

    def decode_from_qkv(
        self, q: torch.Tensor, prologue: QkNormRope, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """A decode-only step's attention from the query part of the QKV rows (a view, each
        row going on with its K and V heads), not yet normed or rotated: the backend's decode
        kernel applies ``prologue`` and stores the new K/V itself (see
        :meth:`decodes_from_qkv`). ``[num_seqs, H, D]``."""
        assert self.k_cache is not None and self.v_cache is not None
        return self.backend.decode_with_prologue(  # type: ignore[attr-defined]
            q, self.k_cache, self.v_cache, metadata, self.scale, prologue
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        metadata: AttentionMetadata,
        kv_stored: bool = False,
    ) -> torch.Tensor:
        """``kv_stored``: the caller already wrote K/V to the caches (see the class docstring)."""
        if not kv_stored and self.k_cache is not None and self.v_cache is not None:
            self.backend.store_kv(k, v, self.k_cache, self.v_cache, metadata.slot_mapping)
        return self.backend.forward(q, k, v, self.k_cache, self.v_cache, metadata, self.scale)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"backend={self.backend.name}, fuse_kv_store={self.fuse_kv_store}"
        )
