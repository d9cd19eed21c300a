"""Attention through the project's own Triton kernels: needs CUDA and triton, no flash-attn.

- ``store_kv``: one launch writes the batch's K/V through ``slot_mapping`` (skipped when the
  model's ``qk_norm_rope`` kernel already wrote them: ``supports_fused_kv_store``);
- prefill: varlen causal attention; keys come from the fresh K/V when no prefill sequence has
  cached context (faster: no page lookups), else through the block table from the cache;
- decode: flash-decoding over pages read in place (its bandwidth: docs/gpu-notes.md); a
  decode-only step may start from the QKV rows, the kernel applying QK-norm and RoPE and storing
  the new K/V itself (``decode_with_prologue``, ``Config.decode_qk_prologue``).

The decode path depends on nothing the host must compute per step (the split count is a
function of the batch size only), so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from engine.model.attention_metadata import AttentionMetadata, QkNormRope


def triton_available(device: torch.device) -> bool:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class TritonSlotStore:
    """``store_kv`` of the CUDA backends: the Triton kernel of ``triton_kv_store`` (imported
    when a backend is built, so importing this module needs no triton). A plain slot write, so
    a model's kernel may do the same write itself (``supports_fused_kv_store``)."""

    supports_fused_kv_store = True

    def __init__(self) -> None:
        from engine.model.kernels.kv_store import store_kv

        self._store_kv = store_kv

    def store_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        self._store_kv(k, v, k_cache, v_cache, slot_mapping)


class TritonAttentionBackend(TritonSlotStore):
    """Paged attention with Triton kernels (see module docstring)."""

    name = "triton"
    supports_cuda_graphs = True
    # Prefill keys can be read through the block table whatever the batch (``paged_prefill``).
    supports_prefill_graphs = True

    def __init__(self) -> None:
        super().__init__()
        from engine.model.kernels.paged_attention import paged_decode_attention, prologue_fits
        from engine.model.kernels.prefill_attention import prefill_attention

        self._decode = paged_decode_attention
        self._prefill = prefill_attention
        self._prologue_fits = prologue_fits

    def decodes_from_qkv(self, head_dim: int) -> bool:
        """Whether :meth:`decode_with_prologue` serves heads of ``head_dim``."""
        return self._prologue_fits(head_dim)

    def decode_with_prologue(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        prologue: QkNormRope,
    ) -> torch.Tensor:
        """A decode-only step from QKV rows: the decode kernel norms and rotates each row's
        query and new key and stores its K/V (``Attention.decode_from_qkv``)."""
        return self._decode(
            q,
            k_cache,
            v_cache,
            metadata.block_tables,
            metadata.context_lens,
            scale,
            order=metadata.decode_order,
            prologue=prologue,
        )

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
        out = torch.empty_like(q)
        num_prefill = metadata.num_prefill_seqs
        num_tokens = metadata.num_prefill_tokens
        if num_prefill:
            paged = k_cache is not None and (
                metadata.has_cached_context or metadata.paged_prefill
            )
            if k_cache is None and metadata.has_cached_context:
                raise ValueError("a prefill with cached context needs a KV cache")
            self._prefill(
                q[:num_tokens],
                k[:num_tokens],
                v[:num_tokens],
                metadata.cu_seqlens_q[: num_prefill + 1],
                metadata.context_lens[:num_prefill],
                metadata.max_seqlen_q,
                scale,
                k_cache=k_cache if paged else None,
                v_cache=v_cache if paged else None,
                block_tables=metadata.block_tables[:num_prefill] if paged else None,
                out=out[:num_tokens],
                # A graph's launch: its sequence slots are mostly empty (prefill_graphs.py).
                flat_tiles=metadata.paged_prefill,
            )
        if metadata.num_decode_seqs:
            if k_cache is None or v_cache is None:
                raise ValueError("decode attention needs a KV cache")
            self._decode(
                q[num_tokens:],
                k_cache,
                v_cache,
                metadata.block_tables[num_prefill:],
                metadata.context_lens[num_prefill:],
                scale,
                out=out[num_tokens:],
                order=metadata.decode_order,
            )
        return out
