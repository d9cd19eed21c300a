"""Model architectures the engine can run, keyed by the ``architectures`` of config.json."""

from __future__ import annotations

from typing import Any

from torch import nn

from engine.errors import ModelLoadError
from engine.model.qwen3 import Qwen3ForCausalLM, Qwen3Spec

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


def resolve_architecture(hf_config: dict[str, Any], source: str = "config.json") -> str:
    """The first supported name in ``hf_config['architectures']``; else a ModelLoadError naming
    what the checkpoint declares and what the engine supports."""
    declared = hf_config.get("architectures")
    if isinstance(declared, str):
        declared = [declared]
    if not isinstance(declared, list) or not declared:
        raise ModelLoadError(
            f"{source} declares no 'architectures'; supported: "
            + ", ".join(supported_architectures())
        )
    for name in declared:
        if name in MODEL_REGISTRY:
            return name
    raise ModelLoadError(
        f"unsupported model architecture {', '.join(map(str, declared))} in {source}; "
        f"supported: {', '.join(supported_architectures())}"
    )


def get_model_class(name: str) -> type[nn.Module]:
    return MODEL_REGISTRY[name]


__all__ = [
    "MODEL_REGISTRY",
    "Qwen3ForCausalLM",
    "Qwen3Spec",
    "get_model_class",
    "resolve_architecture",
    "supported_architectures",
]
