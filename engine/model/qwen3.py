"""Qwen3 (dense) for causal LM, built from the engine's tensor-parallel layers.

Parameter names follow the Hugging Face checkpoint except for the fused projections, which
``packed_modules_mapping`` tells the loader about (q/k/v -> qkv_proj, gate/up -> gate_up_proj).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from engine.model.attention_metadata import AttentionMetadata, QkNormRope
from engine.model.layers.activation import SiluAndMul
from engine.model.layers.attention import Attention, AttentionBackend
from engine.model.layers.cuda_kernels import FusedKernels
from engine.model.layers.decode_gemm import DecodeGemm, SplitKParts
from engine.model.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from engine.model.layers.layernorm import RMSNorm
from engine.model.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from engine.model.layers.parallel import SINGLE_PROCESS, ParallelGroup
from engine.model.layers.rotary_embedding import RotaryEmbedding
from engine.model.qwen3_spec import Qwen3Spec


class Qwen3Attention(nn.Module):
    """Self-attention with per-head RMSNorm on q and k (Qwen3's QK-norm) before RoPE."""

    def __init__(
        self,
        spec: Qwen3Spec,
        group: ParallelGroup,
        backend: AttentionBackend,
        rotary_emb: RotaryEmbedding,
        kernels: FusedKernels | None = None,
    ) -> None:
        super().__init__()
        self.kernels = kernels if kernels is not None else FusedKernels()
        self.head_dim = spec.head_dim
        self.qkv_proj = QKVParallelLinear(
            spec.hidden_size,
            spec.head_dim,
            spec.num_attention_heads,
            spec.num_key_value_heads,
            bias=spec.attention_bias,
            group=group,
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(
            spec.num_attention_heads * spec.head_dim,
            spec.hidden_size,
            bias=spec.attention_bias,
            group=group,
        )
        if self.kernels.split_k is not None:
            table = self.kernels.decode_tilings
            self.o_proj.use_split_k(DecodeGemm(self.kernels.split_k, "o_proj", table))
            if "qkv" in table:
                self.qkv_proj.use_decode_gemm(DecodeGemm(self.kernels.split_k, "qkv", table))
        self.rotary_emb = rotary_emb
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            self.num_kv_heads,
            backend,
            fuse_kv_store=self.kernels.kv_store,
        )
        # Qwen3's q/k norms run inside qk_norm_rope when fused: their own forward is PyTorch.
        self.q_norm = RMSNorm(spec.head_dim, eps=spec.rms_norm_eps)
        self.k_norm = RMSNorm(spec.head_dim, eps=spec.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor | SplitKParts:
        """The attention block's output: a tensor, or on CUDA at decode batch sizes ``o_proj``'s
        split-K partials (the post-attention norm sums them)."""
        qkv = self.qkv_proj(hidden_states)
        kernels = self.kernels.module
        if kernels is not None:  # CUDA: q/k norms and RoPE in one launch
            # ... and, where the backend allows, the KV-cache store too (one launch fewer);
            # or, in a decode-only step, both inside the decode attention kernel.
            o = self._decode_from_qkv(qkv, positions, metadata)
            if o is None:
                q, k, v, stored = self._norm_rope_store(kernels, qkv, positions, metadata)
                o = self.attn(q, k, v, metadata, kv_stored=stored)
            o = o.flatten(1)
            parts = self.o_proj.split_k(o)
            return parts if parts is not None else self.o_proj(o)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, self.num_heads, self.head_dim))
        k = self.k_norm(k.reshape(-1, self.num_kv_heads, self.head_dim))
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary_emb(positions, q, k)
        o = self.attn(q, k, v, metadata)
        return self.o_proj(o.flatten(1))

    def _norm_rope_store(
        self,
        kernels: ModuleType,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """q, k, v from ``qk_norm_rope``, and whether it also stored K/V in the cache."""
        args = (
            qkv,
            self.q_norm.weight,
            self.k_norm.weight,
            self.rotary_emb.cos_cache,
            self.rotary_emb.sin_cache,
            positions,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.q_norm.eps,
        )
        target = self.attn.fused_kv_store_target()
        if target is not None:
            k_cache, v_cache = target
            fused = self.kernels.store.call(
                lambda: kernels.qk_norm_rope(
                    *args, k_cache=k_cache, v_cache=v_cache, slot_mapping=metadata.slot_mapping
                )
            )
            if fused is not None:
                return (*fused, True)
        q, k, v = kernels.qk_norm_rope(*args)
        return q, k, v, False

    def _decode_from_qkv(
        self, qkv: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor | None:
        """A decode-only step's attention output straight from the QKV rows, the decode kernel
        norming and rotating q and k and storing K/V (``FusedKernels.decode_qk_prologue``), or
        None where that does not apply (then ``qk_norm_rope`` runs first)."""
        if metadata.num_prefill_seqs or not self.kernels.decodes_from_qkv(self.attn):
            return None
        prologue = QkNormRope(
            self.q_norm.weight,
            self.k_norm.weight,
            self.rotary_emb.cos_cache,
            self.rotary_emb.sin_cache,
            positions,
            metadata.slot_mapping,
            self.q_norm.eps,
        )
        q = qkv[:, : self.q_size].view(-1, self.num_heads, self.head_dim)
        return self.kernels.prologue.call(lambda: self.attn.decode_from_qkv(q, prologue, metadata))


class Qwen3MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with gate and up fused."""

    def __init__(
        self, spec: Qwen3Spec, group: ParallelGroup, kernels: FusedKernels | None = None
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            spec.hidden_size, [spec.intermediate_size] * 2, bias=False, group=group
        )
        self.down_proj = RowParallelLinear(
            spec.intermediate_size, spec.hidden_size, bias=False, group=group
        )
        self.act_fn = SiluAndMul(kernels.module if kernels is not None else None)
        if kernels is not None and kernels.split_k is not None:
            table = kernels.decode_tilings
            self.down_proj.use_split_k(DecodeGemm(kernels.split_k, "down", table))
            if "gate_up" in table:
                self.gate_up_proj.use_decode_gemm(DecodeGemm(kernels.split_k, "gate_up", table))

    def forward(self, x: torch.Tensor) -> torch.Tensor | SplitKParts:
        """The MLP's output: a tensor, or at decode batch sizes on CUDA ``down``'s split-K
        partials with SwiGLU computed on its operand (the next norm sums them)."""
        gate_up = self.gate_up_proj(x)
        parts = self.down_proj.split_k(gate_up, silu_mul=True)
        return parts if parts is not None else self.down_proj(self.act_fn(gate_up))


class Qwen3DecoderLayer(nn.Module):
    def __init__(
        self,
        spec: Qwen3Spec,
        group: ParallelGroup,
        backend: AttentionBackend,
        rotary_emb: RotaryEmbedding,
        kernels: FusedKernels | None = None,
    ) -> None:
        super().__init__()
        fused = kernels.module if kernels is not None else None
        self.self_attn = Qwen3Attention(spec, group, backend, rotary_emb, kernels)
        self.mlp = Qwen3MLP(spec, group, kernels)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, fused)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, fused)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor | SplitKParts,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor | SplitKParts, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, metadata)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class Qwen3Model(nn.Module):
    def __init__(
        self,
        spec: Qwen3Spec,
        group: ParallelGroup,
        backend: AttentionBackend,
        kernels: FusedKernels | None = None,
        max_positions: int | None = None,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, group)
        # One cos/sin table for all layers (it depends only on the config), as long as the
        # positions the engine can reach: a checkpoint may declare 10^9 (a 1 TB table).
        table = min(spec.max_position_embeddings, max_positions or spec.max_position_embeddings)
        rotary_emb = RotaryEmbedding(spec.head_dim, spec.head_dim, table, spec.rope_theta)
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(spec, group, backend, rotary_emb, kernels)
            for _ in range(spec.num_hidden_layers)
        )
        fused = kernels.module if kernels is not None else None
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, fused)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual, metadata)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class Qwen3ForCausalLM(nn.Module):
    """``forward`` gives final hidden states for every new token; ``compute_logits`` maps the
    rows the caller picked (the sampled positions) to vocabulary logits.

    ``kernels``: the fused CUDA kernels its layers use (one state for the whole model); None:
    the PyTorch code of every layer.
    """

    spec_class = Qwen3Spec
    # checkpoint module name -> (engine module name, shard id for its weight_loader)
    packed_modules_mapping: dict[str, tuple[str, str | int]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(
        self,
        spec: Qwen3Spec,
        backend: AttentionBackend,
        group: ParallelGroup = SINGLE_PROCESS,
        kernels: FusedKernels | None = None,
        max_positions: int | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        self.group = group
        self.kernels = kernels if kernels is not None else FusedKernels()
        self.model = Qwen3Model(spec, group, backend, self.kernels, max_positions)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, group=group)
        if spec.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    @property
    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(input_ids, positions, attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)
