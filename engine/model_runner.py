"""The real executor: runs a Hugging Face Qwen3 checkpoint over a paged KV cache.

``ModelRunner.execute(batch)`` computes, for every scheduled sequence, the tokens the scheduler
asked for, reading earlier KV through the sequence's block table, and samples one token for each
sequence that samples. The KV cache is one tensor ``[2, layers, blocks, block_size, kv_heads,
head_dim]``; each attention layer gets views of its K and V planes. This module runs on CPU
today; CUDA specifics (graphs, measured memory) slot into ``_resolve_device`` and
``_kv_block_count``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engine.attention_metadata import AttentionMetadata, build_attention_metadata
from engine.batch import ScheduledBatch, StepOutput
from engine.config import AUTO_SIZED_BLOCKS, Config
from engine.errors import ConfigError
from engine.layers.attention import get_attention_backend
from engine.layers.parallel import SINGLE_PROCESS
from engine.layers.sampler import Sampler
from engine.loader import build_model

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_PLANES = 2  # K and V


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was requested but no CUDA device is available")
    return torch.device(name)


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


class ModelRunner:
    """Executor over a real model (see ``engine/batch.py`` for the step contract)."""

    def __init__(self, config: Config, model_dir: str | Path | None = None) -> None:
        if config.tensor_parallel_size != 1:
            raise ConfigError(
                "tensor_parallel_size > 1 is not supported by ModelRunner yet (the layers "
                "shard, but no multi-process runner exists)"
            )
        if model_dir is None:
            model_dir = config.model
        if model_dir is None:
            from engine.checkpoint import default_model_dir

            model_dir = default_model_dir()
        self.config = config
        self.model_dir = Path(model_dir)
        self.device = _resolve_device(config.device)
        self.dtype = _resolve_dtype(config.dtype, self.device)
        self.block_size = config.kvcache_block_size
        self.group = SINGLE_PROCESS
        self.attention_backend = get_attention_backend(config.attention_backend, self.device)
        self.model = build_model(
            self.model_dir, self.attention_backend, self.device, self.dtype, self.group
        )
        self.spec = self.model.spec
        self.vocab_size: int = self.spec.vocab_size
        self.eos_token_id: int = (
            config.eos
            if config.eos >= 0
            else (self.spec.eos_token_id if self.spec.eos_token_id is not None else -1)
        )
        self.num_kv_heads = self.model.attention_layers[0].num_kv_heads
        self.num_kvcache_blocks: int = self._kv_block_count()
        self.kv_cache: torch.Tensor | None = torch.zeros(
            KV_PLANES,
            self.spec.num_hidden_layers,
            self.num_kvcache_blocks,
            self.block_size,
            self.num_kv_heads,
            self.spec.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        for i, layer in enumerate(self.model.attention_layers):
            layer.bind_kv_cache(self.kv_cache[0, i], self.kv_cache[1, i])
        self.sampler = Sampler(config.seed, self.device)

    @property
    def kv_block_bytes(self) -> int:
        """Bytes of K and V of one block over all layers on this rank."""
        per_token = KV_PLANES * self.spec.num_hidden_layers * self.num_kv_heads
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return per_token * self.spec.head_dim * self.block_size * itemsize

    def _kv_block_count(self) -> int:
        if self.config.num_kvcache_blocks != AUTO_SIZED_BLOCKS:
            return self.config.num_kvcache_blocks
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            budget = int(total * self.config.gpu_memory_utilization) - used
        else:
            budget = self.config.kv_cache_bytes
        blocks = budget // self.kv_block_bytes
        if blocks < 1:
            raise ConfigError(
                f"the KV cache budget ({budget} bytes) is smaller than one block "
                f"({self.kv_block_bytes} bytes); raise kv_cache_bytes or lower kvcache_block_size"
            )
        return blocks

    def _check_batch(self, batch: ScheduledBatch) -> None:
        """Scheduler bugs must fail loudly here, not read or write someone else's KV."""
        n = len(batch.seqs)
        if len(batch.num_new_tokens) != n or len(batch.context_lens) != n:
            raise ValueError("num_new_tokens and context_lens need one entry per sequence")
        if batch.sample is not None and len(batch.sample) != n:
            raise ValueError("sample needs one entry per sequence")
        for seq, new, ctx in zip(batch.seqs, batch.num_new_tokens, batch.context_lens):
            if not 1 <= new <= ctx <= len(seq.token_ids):
                raise ValueError(
                    f"seq {seq.seq_id}: need 1 <= num_new_tokens ({new}) <= context_len ({ctx}) "
                    f"<= tokens ({len(seq.token_ids)})"
                )
            if ctx > self.spec.max_position_embeddings:
                raise ValueError(
                    f"seq {seq.seq_id}: context {ctx} exceeds the model's "
                    f"max_position_embeddings ({self.spec.max_position_embeddings})"
                )
            needed = seq.block_table[: (ctx + self.block_size - 1) // self.block_size]
            if len(needed) * self.block_size < ctx:
                raise ValueError(
                    f"seq {seq.seq_id}: block table of {len(seq.block_table)} blocks cannot hold "
                    f"{ctx} tokens of block size {self.block_size}"
                )
            if needed and not (0 <= min(needed) and max(needed) < self.num_kvcache_blocks):
                raise ValueError(
                    f"seq {seq.seq_id}: block id outside [0, {self.num_kvcache_blocks}) in "
                    f"{needed}"
                )

    def prepare(
        self, batch: ScheduledBatch
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int], list[float]]:
        """Flat input ids, positions, attention metadata, rows to sample, temperatures."""
        self._check_batch(batch)
        input_ids: list[int] = []
        sample_rows: list[int] = []
        temperatures: list[float] = []
        offset = 0
        for i, seq in enumerate(batch.seqs):
            new, ctx = batch.num_new_tokens[i], batch.context_lens[i]
            input_ids.extend(seq.token_ids[ctx - new : ctx])
            offset += new
            if batch.sample is None or batch.sample[i]:
                sample_rows.append(offset - 1)
                temperatures.append(seq.temperature)
        positions, metadata = build_attention_metadata(
            batch.num_new_tokens,
            batch.context_lens,
            [seq.block_table for seq in batch.seqs],
            self.block_size,
            batch.num_prefill_seqs,
            self.device,
        )
        ids = torch.tensor(input_ids, dtype=torch.int64).to(self.device)
        return ids, positions, metadata, sample_rows, temperatures

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepOutput:
        """Run one step; one sampled token per sampling sequence, in batch order."""
        if self.kv_cache is None:
            raise RuntimeError("ModelRunner.execute called after close()")
        if not batch.seqs:
            return StepOutput(token_ids=[])
        input_ids, positions, metadata, rows, temperatures = self.prepare(batch)
        hidden = self.model(input_ids, positions, metadata)
        if not rows:
            return StepOutput(token_ids=[])
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, index))
        tokens = self.sampler(logits, temperatures)
        # Eager execution: the batch runs at its own size (a CUDA graph would pad it).
        return StepOutput(token_ids=tokens.tolist(), padded_batch_size=len(batch.seqs))

    def describe(self) -> dict[str, Any]:
        """What the trace header records: where and how the model runs, and its architecture."""
        spec = self.spec
        return {
            "executor": "model_runner",
            "device": str(self.device),
            "device_name": (
                torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
            ),
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention_backend": self.attention_backend.name,
            "tensor_parallel_size": self.group.world_size,
            "block_size": self.block_size,
            "num_kvcache_blocks": self.num_kvcache_blocks,
            "kv_cache_bytes": self.num_kvcache_blocks * self.kv_block_bytes,
            "eos_token_id": self.eos_token_id,
            "model": {
                "architecture": type(self.model).__name__,
                "path": str(self.model_dir),
                "num_layers": spec.num_hidden_layers,
                "num_heads": spec.num_attention_heads,
                "num_kv_heads": spec.num_key_value_heads,
                "head_dim": spec.head_dim,
                "hidden_size": spec.hidden_size,
                "intermediate_size": spec.intermediate_size,
                "vocab_size": spec.vocab_size,
                "max_position_embeddings": spec.max_position_embeddings,
                "rope_theta": spec.rope_theta,
                "tie_word_embeddings": spec.tie_word_embeddings,
                "num_params": sum(p.numel() for p in self.model.parameters()),
                "checkpoint_dtype": spec.torch_dtype,
                "dtype": str(self.dtype).removeprefix("torch."),
            },
        }

    def close(self) -> None:
        """Release the KV cache and the model (idempotent)."""
        if self.kv_cache is None:
            return
        for layer in self.model.attention_layers:
            layer.bind_kv_cache(None, None)
        self.kv_cache = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
