"""What a model runner tells the trace header: where and how the model runs, its architecture."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from engine.runner.cuda_setup import describe_cuda

if TYPE_CHECKING:
    from engine.runner.model_runner import ModelRunner


def describe_runner(runner: ModelRunner) -> dict[str, Any]:
    """The runner's description (``ModelRunner.describe``)."""
    spec = runner.spec
    info: dict[str, Any] = {
        "executor": "model_runner",
        "device": str(runner.device),
        "device_name": (
            torch.cuda.get_device_name(runner.device) if runner.device.type == "cuda" else "cpu"
        ),
        "dtype": str(runner.dtype).removeprefix("torch."),
        "attention_backend": runner.attention_backend.name,
        "tensor_parallel_size": runner.group.world_size,
        "block_size": runner.block_size,
        "num_kvcache_blocks": runner.num_kvcache_blocks,
        "kv_cache_bytes": runner.num_kvcache_blocks * runner.kv_block_bytes,
        "eos_token_id": runner.eos_token_id,
        "model": {
            "architecture": type(runner.model).__name__,
            "path": str(runner.model_dir),
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
            "num_params": sum(p.numel() for p in runner.model.parameters()),
            "checkpoint_dtype": spec.torch_dtype,
            "dtype": str(runner.dtype).removeprefix("torch."),
        },
    }
    if runner.device.type == "cuda":
        info.update(describe_cuda(runner))
    return info
