"""The Qwen3 architecture's hyper-parameters, read and validated from a Hugging Face
``config.json`` (torch-free: the model in ``qwen3.py`` is built from them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ModelLoadError

# Hugging Face's defaults for fields a Qwen3 config.json may omit.
HF_DEFAULT_MAX_POSITIONS = 32768
HF_DEFAULT_RMS_EPS = 1e-6
HF_DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class Qwen3Spec:
    """The architecture hyper-parameters the engine uses, read from ``config.json``."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = HF_DEFAULT_MAX_POSITIONS
    rms_norm_eps: float = HF_DEFAULT_RMS_EPS
    rope_theta: float = HF_DEFAULT_ROPE_THETA
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    torch_dtype: str | None = None
    eos_token_id: int | None = None

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], source: str = "config.json") -> Qwen3Spec:
        """Validate a Hugging Face Qwen3 config dict; errors name ``source`` and the field."""

        def integer(name: str, default: int | None = None) -> int:
            value = cfg.get(name)
            if value is None:  # absent or null: transformers' default
                value = default
            if value is None:
                raise ModelLoadError(f"{source}: required field {name!r} is missing")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(f"{source}: {name} must be a positive integer, got {value!r}")
            return value

        def number(name: str, value: object) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ModelLoadError(f"{source}: {name} must be a positive number, got {value!r}")
            return float(value)

        def flag(name: str) -> bool:
            value = cfg.get(name)
            if value is None:  # absent or null: transformers' default
                return False
            if not isinstance(value, bool):  # "false" is truthy: read as true, silently
                raise ModelLoadError(f"{source}: {name} must be true or false, got {value!r}")
            return value

        def unsupported(what: str) -> ModelLoadError:
            return ModelLoadError(f"{source}: {what} is not supported by the Qwen3 model")

        if cfg.get("hidden_act", "silu") != "silu":
            raise unsupported(f"hidden_act {cfg.get('hidden_act')!r}")
        if flag("use_sliding_window"):
            raise unsupported("use_sliding_window=true")
        if cfg.get("quantization_config"):  # its scales are tensors the engine would not apply
            method = cfg["quantization_config"]
            method = method.get("quant_method", "?") if isinstance(method, dict) else method
            raise unsupported(f"a quantized checkpoint (quantization_config {method!r})")
        # transformers 5 writes rope_parameters; 4.x checkpoints have rope_theta (+ rope_scaling).
        rope_settings = [cfg[k] for k in ("rope_parameters", "rope_scaling") if cfg.get(k)]
        for rope in rope_settings:
            if not isinstance(rope, dict):
                raise unsupported(f"rope settings {rope!r}")
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type != "default":
                raise unsupported(f"rope type {rope_type!r}")
        rope_theta = next(
            (r["rope_theta"] for r in rope_settings if "rope_theta" in r),
            cfg.get("rope_theta", HF_DEFAULT_ROPE_THETA),
        )

        heads = integer("num_attention_heads")
        hidden = integer("hidden_size")
        kv_heads = integer("num_key_value_heads", heads)
        if heads % kv_heads:  # grouped-query attention: each KV head serves a whole group
            raise ModelLoadError(
                f"{source}: num_attention_heads ({heads}) must be a multiple of "
                f"num_key_value_heads ({kv_heads})"
            )
        vocab = integer("vocab_size")
        eos = cfg.get("eos_token_id")
        ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab for i in ids):
            # A string or an id past the vocabulary was dropped: the engine never stopped.
            raise ModelLoadError(
                f"{source}: eos_token_id must be a token id in [0, {vocab}) or a list of them, "
                f"got {eos!r}"
            )
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=integer("intermediate_size"),
            num_hidden_layers=integer("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=integer("head_dim", hidden // heads),
            max_position_embeddings=integer("max_position_embeddings", HF_DEFAULT_MAX_POSITIONS),
            rms_norm_eps=number("rms_norm_eps", cfg.get("rms_norm_eps", HF_DEFAULT_RMS_EPS)),
            rope_theta=number("rope_theta", rope_theta),
            tie_word_embeddings=flag("tie_word_embeddings"),
            attention_bias=flag("attention_bias"),
            torch_dtype=cfg.get("torch_dtype", cfg.get("dtype")),
            eos_token_id=ids[0] if ids else None,  # several stop ids: the engine stops on the first
        )

    def describe(self) -> dict[str, Any]:
        """The architecture as the trace header's ``model`` entry records it."""
        return {
            "num_layers": self.num_hidden_layers,
            "num_heads": self.num_attention_heads,
            "num_kv_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "checkpoint_dtype": self.torch_dtype,
        }
