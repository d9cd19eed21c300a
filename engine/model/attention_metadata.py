"""Per-step attention inputs, passed explicitly to the model (no module-global context).

Nano-vLLM keeps these in a global ``Context`` set before and reset after each forward; here the
runner builds one immutable :class:`AttentionMetadata` per step and the model hands it to every
attention layer, so two runners (or a replay and a live engine) can coexist in one process.

A batch holds prefill work (whole prompts or chunks, possibly after a prefix-cache hit) first and
decodes (one query token each) last. Sequence ``i`` computes tokens ``[context_lens[i] -
query_lens[i], context_lens[i])``; its KV, old and new, lives in the paged cache at slots
``block_tables[i][p // block_size] * block_size + p % block_size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

BLOCK_TABLE_PAD = -1  # entries past a sequence's last block; kernels never read them


@dataclass(frozen=True)
class AttentionMetadata:
    """Everything an attention backend needs for one step (vLLM vocabulary).

    Tensors live on the model's device; the ``*_host`` tuples are the same numbers on the host,
    for backends that loop in Python without forcing a device sync.
    """

    num_prefill_seqs: int
    num_prefill_tokens: int
    num_decode_seqs: int
    block_size: int
    slot_mapping: torch.Tensor  # int64 [num_tokens]: cache slot of each new token
    cu_seqlens_q: torch.Tensor  # int32 [num_seqs + 1]: query offsets in the flat batch
    cu_seqlens_k: torch.Tensor  # int32 [num_seqs + 1]: cumulative context lengths
    context_lens: torch.Tensor  # int32 [num_seqs]: keys each sequence attends to
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks], padded with BLOCK_TABLE_PAD
    max_seqlen_q: int  # longest query among prefill sequences (0 without prefills)
    max_seqlen_k: int  # longest context among prefill sequences (0 without prefills)
    max_decode_seqlen_k: int  # longest context among decode sequences (0 without decodes)
    query_lens_host: tuple[int, ...]
    context_lens_host: tuple[int, ...]
    # Prefill keys are read through the block table even without cached context: a CUDA-graph
    # prefill (engine/runner/prefill_graphs.py), whose batch is unknown when it is captured.
    paged_prefill: bool = False
    # int32 [num_decode_seqs]: the decode rows in the order the decode kernel's programs take
    # them (``rows_longest_first``, staged by engine/runner/decode_graphs.py); None: row order.
    decode_order: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return self.num_prefill_seqs + self.num_decode_seqs

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def has_cached_context(self) -> bool:
        """True when some prefill reads keys it does not compute (prefix hit or earlier chunk)."""
        return any(
            self.context_lens_host[i] > self.query_lens_host[i]
            for i in range(self.num_prefill_seqs)
        )


def rows_longest_first(context_lens: np.ndarray | Sequence[int]) -> np.ndarray:
    """Row indices by context length, longest first, equal lengths in row order (so padding
    rows, context 0, come last): the order in which the decode kernel's programs take the rows
    (``AttentionMetadata.decode_order``)."""
    return np.argsort(-np.asarray(context_lens, dtype=np.int64), kind="stable")


def build_attention_metadata(
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    num_prefill_seqs: int,
    device: torch.device | str = "cpu",
    longest_first: bool = False,
) -> tuple[torch.Tensor, AttentionMetadata]:
    """Positions of the batch's new tokens and the matching metadata.

    Slots are computed vectorized on the host (one small tensor per field), then moved to
    ``device`` once. ``longest_first``: the metadata names the decode rows longest context
    first (``decode_order``) for the decode kernel.
    """
    num_seqs = len(query_lens)
    if not (len(context_lens) == len(block_tables) == num_seqs):
        raise ValueError("query_lens, context_lens and block_tables must have one entry per seq")
    if not 0 <= num_prefill_seqs <= num_seqs:
        raise ValueError(f"num_prefill_seqs {num_prefill_seqs} not in [0, {num_seqs}]")
    for i in range(num_prefill_seqs, num_seqs):
        if query_lens[i] != 1:
            raise ValueError(f"decode sequence {i} has {query_lens[i]} query tokens, expected 1")

    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    k_lens = torch.tensor(context_lens, dtype=torch.int64)
    max_blocks = max((len(t) for t in block_tables), default=0)
    width = max(max_blocks, 1)
    padded = [list(t) + [BLOCK_TABLE_PAD] * (width - len(t)) for t in block_tables]
    tables = torch.tensor(padded, dtype=torch.int64).reshape(num_seqs, width)

    cu_q = torch.zeros(num_seqs + 1, dtype=torch.int64)
    cu_q[1:] = torch.cumsum(q_lens, 0)
    cu_k = torch.zeros(num_seqs + 1, dtype=torch.int64)
    cu_k[1:] = torch.cumsum(k_lens, 0)
    num_tokens = int(cu_q[-1])

    # Token t of sequence s sits at position start_s + (t - cu_q[s]).
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs), q_lens)
    starts = k_lens - q_lens
    positions = torch.arange(num_tokens) - (cu_q[:-1] - starts)[seq_of_token]
    blocks = tables[seq_of_token, positions // block_size]
    slot_mapping = blocks * block_size + positions % block_size

    prefill_q = query_lens[:num_prefill_seqs]
    prefill_k = context_lens[:num_prefill_seqs]
    decode_k = context_lens[num_prefill_seqs:]
    decode_order = None
    if longest_first and decode_k:
        decode_order = torch.from_numpy(rows_longest_first(decode_k)).to(device=device,
                                                                          dtype=torch.int32)
    metadata = AttentionMetadata(
        num_prefill_seqs=num_prefill_seqs,
        num_prefill_tokens=int(sum(prefill_q)),
        num_decode_seqs=num_seqs - num_prefill_seqs,
        block_size=block_size,
        slot_mapping=slot_mapping.to(device),
        cu_seqlens_q=cu_q.to(device=device, dtype=torch.int32),
        cu_seqlens_k=cu_k.to(device=device, dtype=torch.int32),
        context_lens=k_lens.to(device=device, dtype=torch.int32),
        block_tables=tables.to(device=device, dtype=torch.int32),
        max_seqlen_q=max(prefill_q, default=0),
        max_seqlen_k=max(prefill_k, default=0),
        max_decode_seqlen_k=max(decode_k, default=0),
        query_lens_host=tuple(int(n) for n in query_lens),
        context_lens_host=tuple(int(n) for n in context_lens),
        decode_order=decode_order,
    )
    return positions.to(device), metadata


@dataclass(frozen=True)
class QkNormRope:
    """What lets a backend's decode kernel start from the QKV projection's rows instead of
    ``q`` (``Attention.decode_from_qkv``): Qwen3's per-head RMSNorm (``q_weight``/``k_weight``,
    ``eps``) and RoPE (NeoX ``cos_cache``/``sin_cache`` at ``positions``) of each row's query
    heads and new key, and the new K/V's cache slots (``slot_mapping``, ``-1``: a padding row,
    nothing stored). The kernel writes what ``qk_norm_rope`` + ``store_kv`` would, one launch
    fewer."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    cos_cache: torch.Tensor
    sin_cache: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    eps: float
