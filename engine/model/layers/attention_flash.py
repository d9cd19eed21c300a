"""Attention through flash-attn 2 (``flash_attn_varlen_func`` / ``flash_attn_with_kvcache``).

Used when the ``flash_attn`` package imports. This path is written against flash-attn's
documented API and has not run on the project's GPU (docs/gpu-notes.md). flash-attn reads paged
KV only with pages whose size is a multiple of 256 tokens; other block sizes are refused at
selection time. K/V are stored with the Triton kernel (flash-attn has no store of its own).
"""

from __future__ import annotations

import importlib.util

import torch

from engine.model.attention_metadata import AttentionMetadata
from engine.model.layers.attention_triton import TritonSlotStore

# flash-attn 2's paged KV needs page_block_size % 256 == 0.
FLASH_ATTN_PAGE_MULTIPLE = 256


def flash_attn_available(device: torch.device) -> bool:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return importlib.util.find_spec("flash_attn") is not None


class FlashAttnBackend(TritonSlotStore):
    """Nano-vLLM's attention: varlen prefill (paged when there is cached context), paged decode."""

    name = "flash_attn"
    supports_cuda_graphs = True

    def __init__(self) -> None:
        super().__init__()
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache

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
        if k_cache is not None and k_cache.shape[1] % FLASH_ATTN_PAGE_MULTIPLE:
            raise ValueError(
                f"flash-attn needs a KV block size that is a multiple of "
                f"{FLASH_ATTN_PAGE_MULTIPLE}, got {k_cache.shape[1]}"
            )
        out = torch.empty_like(q)
        num_prefill = metadata.num_prefill_seqs
        num_tokens = metadata.num_prefill_tokens
        if num_prefill:
            cu_q = metadata.cu_seqlens_q[: num_prefill + 1]
            if k_cache is not None and metadata.has_cached_context:
                keys, values = k_cache, v_cache
                cu_k = metadata.cu_seqlens_k[: num_prefill + 1]
                table = metadata.block_tables[:num_prefill]
                max_k = metadata.max_seqlen_k
            else:
                keys, values, cu_k, table = k[:num_tokens], v[:num_tokens], cu_q, None
                max_k = metadata.max_seqlen_q
            out[:num_tokens] = self._varlen(
                q[:num_tokens],
                keys,
                values,
                cu_seqlens_q=cu_q,
                cu_seqlens_k=cu_k,
                max_seqlen_q=metadata.max_seqlen_q,
                max_seqlen_k=max_k,
                softmax_scale=scale,
                causal=True,
                block_table=table,
            )
        if metadata.num_decode_seqs:
            if k_cache is None or v_cache is None:
                raise ValueError("decode attention needs a KV cache")
            decoded = self._with_kvcache(
                q[num_tokens:].unsqueeze(1),
                k_cache,
                v_cache,
                cache_seqlens=metadata.context_lens[num_prefill:],
                block_table=metadata.block_tables[num_prefill:],
                softmax_scale=scale,
                causal=True,
            )
            out[num_tokens:] = decoded.squeeze(1)
        return out
