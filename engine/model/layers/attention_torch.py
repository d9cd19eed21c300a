"""Attention in plain PyTorch: runs on any device, the reference the faster backends match.

Prefill sequences are handled one by one (each reads its keys through its block table, so a
prefix-cache hit or an earlier chunk is just more context); decodes are batched by gathering
their blocks into a padded ``[seqs, keys, kv_heads, head_dim]`` tensor, in chunks that bound the
memory of that copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model.attention_metadata import AttentionMetadata

# Upper bound on elements in one gathered decode K (or V) copy: 2**26 float32 = 256 MiB.
DECODE_GATHER_BUDGET_ELEMENTS = 1 << 26


class TorchAttentionBackend:
    """``scaled_dot_product_attention`` over K/V gathered from the paged cache."""

    name = "torch"

    def store_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        flat_k = k_cache.view(-1, *k_cache.shape[2:])
        flat_v = v_cache.view(-1, *v_cache.shape[2:])
        keep = slot_mapping >= 0
        if not bool(keep.all()):
            k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
        flat_k.index_copy_(0, slot_mapping, k.to(flat_k.dtype))
        flat_v.index_copy_(0, slot_mapping, v.to(flat_v.dtype))

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
        num_prefill_tokens = metadata.num_prefill_tokens
        if metadata.num_prefill_seqs:
            self._prefill(q, k, v, k_cache, v_cache, metadata, scale, out)
        if metadata.num_decode_seqs:
            if k_cache is None or v_cache is None:
                raise ValueError("decode attention needs a KV cache")
            out[num_prefill_tokens:] = self._decode(
                q[num_prefill_tokens:], k_cache, v_cache, metadata, scale
            )
        return out

    def _prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor | None,
        v_cache: torch.Tensor | None,
        md: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
    ) -> None:
        block_size = md.block_size
        q_start = 0
        for i in range(md.num_prefill_seqs):
            q_len = md.query_lens_host[i]
            ctx = md.context_lens_host[i]
            q_end = q_start + q_len
            if k_cache is None or v_cache is None:
                if ctx != q_len:
                    raise ValueError("a prefill with cached context needs a KV cache")
                keys, values = k[q_start:q_end], v[q_start:q_end]
            else:
                blocks = md.block_tables[i, : (ctx + block_size - 1) // block_size].long()
                keys = k_cache[blocks].flatten(0, 1)[:ctx]
                values = v_cache[blocks].flatten(0, 1)[:ctx]
            out[q_start:q_end] = _attend_causal(q[q_start:q_end], keys, values, ctx - q_len, scale)
            q_start = q_end

    def _decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        md: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        block_size = md.block_size
        first = md.num_prefill_seqs
        num_blocks = (md.max_decode_seqlen_k + block_size - 1) // block_size
        per_seq = num_blocks * block_size * k_cache.shape[2] * k_cache.shape[3]
        chunk = max(1, DECODE_GATHER_BUDGET_ELEMENTS // max(per_seq, 1))
        parts = []
        for lo in range(0, q.shape[0], chunk):
            hi = min(lo + chunk, q.shape[0])
            # Padding entries (-1) are clamped to block 0; the mask hides whatever they hold,
            # and the cache is zero-initialized so masked values are finite.
            tables = md.block_tables[first + lo : first + hi, :num_blocks].long().clamp(min=0)
            keys = k_cache[tables].flatten(1, 2)  # [seqs, keys, kv_heads, head_dim]
            values = v_cache[tables].flatten(1, 2)
            lens = md.context_lens[first + lo : first + hi].to(torch.int64)
            key_pos = torch.arange(keys.shape[1], device=q.device)
            mask = (key_pos[None, :] < lens[:, None])[:, None, None, :]
            parts.append(_sdpa(q[lo:hi].unsqueeze(1), keys, values, mask, scale).squeeze(1))
        return torch.cat(parts) if len(parts) > 1 else parts[0]


def _attend_causal(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, offset: int, scale: float
) -> torch.Tensor:
    """Query ``j`` (at position ``offset + j``) attends to keys ``[0, offset + j]``."""
    q_len, ctx = q.shape[0], keys.shape[0]
    query_pos = torch.arange(q_len, device=q.device) + offset
    key_pos = torch.arange(ctx, device=q.device)
    mask = key_pos[None, :] <= query_pos[:, None]
    return _sdpa(q.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), mask, scale).squeeze(0)


def _sdpa(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Batched attention: ``q`` ``[B, Lq, H, D]``, keys/values ``[B, Lk, KvH, D]``, boolean
    ``mask`` broadcastable to ``[B, 1, Lq, Lk]`` (True: attend).

    Grouped-query attention without copying K/V per query head: the ``G = H / KvH`` query heads
    sharing a KV head become ``G`` extra query rows of that head (rows ordered ``(l, g)``), and
    the mask rows are repeated to match.
    """
    batch, q_len, num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[2]
    group = num_heads // num_kv_heads
    rows = q.reshape(batch, q_len, num_kv_heads, group, head_dim).permute(0, 2, 1, 3, 4)
    rows = rows.reshape(batch, num_kv_heads, q_len * group, head_dim)
    if group > 1 and mask.shape[-2] != 1:
        mask = mask.repeat_interleave(group, dim=-2)
    out = F.scaled_dot_product_attention(
        rows,
        keys.transpose(1, 2).to(q.dtype),
        values.transpose(1, 2).to(q.dtype),
        attn_mask=mask,
        scale=scale,
    )
    out = out.reshape(batch, num_kv_heads, q_len, group, head_dim).permute(0, 2, 1, 3, 4)
    return out.reshape(batch, q_len, num_heads, head_dim)
