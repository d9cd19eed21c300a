"""Make Qwen3-architecture checkpoints with random weights, and the cached default model.

A made checkpoint is an ordinary Hugging Face directory (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json) that transformers loads as well
as the engine does. Its text is meaningless, but the tokenizer is Qwen's real one, so prompts,
token ids and lengths look like production traffic.

Random init is chosen for numerically robust greedy decoding (tests compare greedy tokens with
transformers): embeddings (tied to the LM head) have a large std so top-1 logit margins are
wide, and every projection is scaled by ``gain/sqrt(fan_in)`` so each layer adds more than the
token embedding to the residual stream and outputs depend on context (no one-token loops).
Norm weights are ``1 + noise`` so a misloaded norm cannot go unnoticed. Vocabulary rows past the
tokenizer (151669..151935) are zero, as padding rows are, so they are never the greedy choice.

That is enough for the float32 ``tiny`` preset, not for bf16 at depth: with all-random weights
the logits are near-Gaussian over 151,936 rows, so the top-1/top-2 gap is about what bf16
rounding (of activations through 28 layers, and of the logits themselves) moves it by, and bf16
and float32 greedy tokens often differ, in transformers as in the engine (figures:
docs/gpu-notes.md, "Where the numbers in the code went"). A trained model is confident: its
top-1 logit stands far above the rest. No rescaling of random weights gets there without
degenerating (a gap made by the current token's own embedding is a model that repeats its
input), so the
``qwen3-0.6b-confident`` preset sets two knobs (``tools/checkpoint_margins.py`` measures them):

* ``scaled_residual_init``: o_proj and down_proj std times ``1/sqrt(2 * num_layers)``
  (GPT-2/Megatron scaled init), so the 2L random residual branches add O(1) to the stream
  together instead of each one dominating it (and the circuit below).
* ``skip_bigram_gain``: plants one circuit, a confident skip-bigram "language": the greedy next
  token is ``sigma(previous token)`` for a fixed random permutation ``sigma`` of the vocabulary
  (``engine/model/confident.py`` says how; ``successor_permutation`` returns ``sigma``).

Base-model convention: eos is ``<|endoftext|>`` (151643), as in Qwen3 base checkpoints; chat
checkpoints use ``<|im_end|>`` (151645).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.errors import ConfigError, ModelLoadError
from engine.model.confident import (
    USED_VOCAB,
    circuit_generator,
    plant_skip_bigram_embedding,
    skip_bigram_attention,
    successor_permutation,
)
from engine.model.tokenizer import (
    ENDOFTEXT,
    QWEN3_SPECIAL_START_ID,
    build_qwen3_tokenizer_json,
    qwen3_tokenizer_config,
    qwen_tiktoken_path,
)

QWEN3_VOCAB_SIZE = 151936  # embedding rows of every Qwen3 checkpoint (padded past the tokenizer)
EOS_TOKEN_ID = QWEN3_SPECIAL_START_ID  # <|endoftext|>
BOS_TOKEN_ID = QWEN3_SPECIAL_START_ID
# Bump when presets or the weight generator change: cached default models are keyed by it.
FORMAT_VERSION = 2
CACHE_ENV = "REPLAYLLM_CACHE"
DEFAULT_PRESET = "tiny"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PROVENANCE_FILE = "replayllm.json"
# Weight seeds: what torch.Generator.manual_seed takes, and Config.seed's range.
MAX_SEED = 2**63 - 1
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
__all__ = ["USED_VOCAB", "ModelPreset", "make_model", "random_weights", "successor_permutation"]


@dataclass(frozen=True)
class ModelPreset:
    """Architecture of a made checkpoint, plus how its random weights are drawn."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    torch_dtype: str
    max_position_embeddings: int = 40960
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    vocab_size: int = QWEN3_VOCAB_SIZE
    embedding_std: float = 1.0  # large: wide top-1 margins through the tied LM head
    # Weight std = gain / sqrt(fan_in). Above 1 so layers, not the current token's own
    # embedding, dominate the residual stream: at gain 1 the tied head keeps predicting the input
    # token and greedy decoding repeats one token forever.
    projection_gain: float = 2.0
    norm_jitter: float = 0.1  # norm weights = 1 + jitter * N(0, 1)
    # o_proj/down_proj std also times 1/sqrt(2 * num_layers) (GPT-2/Megatron scaled init): deep
    # bf16 stacks then add O(1) to the residual stream in total instead of amplifying rounding
    # noise through every layer, and the planted circuit stays on top.
    scaled_residual_init: bool = False
    # > 0 plants the skip-bigram circuit (engine/model/confident.py) with this copy gain relative
    # to the embedding: top-1 margins as wide as a trained model's, so bf16 and float32 agree on the
    # greedy token. 0 keeps every weight random (tiny: float32, 4 layers, margins suffice).
    skip_bigram_gain: float = 0.0


PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset(
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        torch_dtype="float32",
    ),
    # Qwen3-0.6B's exact architecture (GPU benchmarks); weights stored in bf16 as Qwen ships them.
    "qwen3-0.6b": ModelPreset(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        torch_dtype="bfloat16",
    ),
}
# The same architecture with logit margins like a trained model's (module docstring): what a
# bf16 top-1 agreement measures an implementation with (tools/checkpoint_margins.py measures
# the bf16/float32 agreement of both presets: docs/gpu-notes.md). Its argmax
# is set by the embedding, layer 0 and the head, so the all-random preset stays the one
# benchmarks and logit-error checks of every layer use.
PRESETS["qwen3-0.6b-confident"] = dataclasses.replace(
    PRESETS["qwen3-0.6b"], scaled_residual_init=True, skip_bigram_gain=3.0
)

def get_preset(name: str) -> ModelPreset:
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def hf_config(preset: ModelPreset) -> dict[str, Any]:
    """``config.json`` as Qwen3 checkpoints write it (transformers' Qwen3Config fields)."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "head_dim": preset.head_dim,
        "hidden_act": "silu",
        "hidden_size": preset.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": preset.intermediate_size,
        "max_position_embeddings": preset.max_position_embeddings,
        "max_window_layers": preset.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": preset.num_attention_heads,
        "num_hidden_layers": preset.num_hidden_layers,
        "num_key_value_heads": preset.num_key_value_heads,
        "rms_norm_eps": preset.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": preset.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": preset.tie_word_embeddings,
        "torch_dtype": preset.torch_dtype,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": preset.vocab_size,
    }


def random_weights(preset: ModelPreset, seed: int = 0) -> dict[str, torch.Tensor]:
    """Hugging Face-named tensors drawn in a fixed order from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    dtype = _DTYPES[preset.torch_dtype]
    p = preset
    residual_scale = 1.0 / math.sqrt(2 * p.num_hidden_layers)

    def normal(shape: tuple[int, ...], std: float) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * std).to(dtype)

    def linear(out_features: int, in_features: int, residual: bool = False) -> torch.Tensor:
        std = p.projection_gain / math.sqrt(in_features)
        if residual and p.scaled_residual_init:
            std *= residual_scale
        return normal((out_features, in_features), std)

    def norm(size: int) -> torch.Tensor:
        return (1.0 + torch.randn(size, generator=gen) * p.norm_jitter).to(dtype)

    embed = torch.randn((p.vocab_size, p.hidden_size), generator=gen) * p.embedding_std
    embed[USED_VOCAB:] = 0.0
    circuit = circuit_generator(seed) if p.skip_bigram_gain else None
    shared = plant_skip_bigram_embedding(p, embed, circuit) if circuit is not None else None
    tensors = {"model.embed_tokens.weight": embed.to(dtype)}
    del embed
    q_out = p.num_attention_heads * p.head_dim
    kv_out = p.num_key_value_heads * p.head_dim
    for i in range(p.num_hidden_layers):
        pre = f"model.layers.{i}."
        tensors[pre + "self_attn.q_proj.weight"] = linear(q_out, p.hidden_size)
        tensors[pre + "self_attn.k_proj.weight"] = linear(kv_out, p.hidden_size)
        tensors[pre + "self_attn.v_proj.weight"] = linear(kv_out, p.hidden_size)
        tensors[pre + "self_attn.o_proj.weight"] = linear(p.hidden_size, q_out, residual=True)
        tensors[pre + "self_attn.q_norm.weight"] = norm(p.head_dim)
        tensors[pre + "self_attn.k_norm.weight"] = norm(p.head_dim)
        tensors[pre + "mlp.gate_proj.weight"] = linear(p.intermediate_size, p.hidden_size)
        tensors[pre + "mlp.up_proj.weight"] = linear(p.intermediate_size, p.hidden_size)
        tensors[pre + "mlp.down_proj.weight"] = linear(
            p.hidden_size, p.intermediate_size, residual=True
        )
        tensors[pre + "input_layernorm.weight"] = norm(p.hidden_size)
        tensors[pre + "post_attention_layernorm.weight"] = norm(p.hidden_size)
    tensors["model.norm.weight"] = norm(p.hidden_size)
    if not p.tie_word_embeddings:
        tensors["lm_head.weight"] = normal((p.vocab_size, p.hidden_size), p.embedding_std)
    if circuit is not None and shared is not None:
        # Layer 0's drawn attention weights are replaced (drawing them keeps every other tensor
        # identical to the same preset without the circuit).
        tensors.update(skip_bigram_attention(p, shared, circuit, dtype))
        sign = torch.ones(p.hidden_size)
        sign[p.hidden_size // 2 :] = -1.0
        tensors["model.norm.weight"] = (tensors["model.norm.weight"].float() * sign).to(dtype)
    return tensors


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make_model(preset: str, out_dir: str | Path, seed: int = 0, force: bool = False) -> Path:
    """Write a complete Hugging Face Qwen3 checkpoint for ``preset`` into ``out_dir``.

    The same preset and seed give byte-identical files. The checkpoint is written into a
    temporary sibling and renamed into place: a full disk or a crash leaves nothing under
    ``out_dir``; an existing ``out_dir`` is replaced only if make-model wrote it and ``force``
    (``tracing.outdir``). ``seed`` is an integer in ``[0, MAX_SEED]``.
    """
    from tracing.outdir import CHECKPOINT, staged_dir

    spec = get_preset(preset)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"seed must be an integer in [0, {MAX_SEED}], got {seed!r}")
    out = Path(out_dir).expanduser()
    with staged_dir(out, CHECKPOINT, "make-model", force) as stage:
        _write_checkpoint(stage, preset, spec, seed)
    return out


def _write_checkpoint(out: Path, preset: str, spec: ModelPreset, seed: int) -> None:
    _write_json(out / "config.json", hf_config(spec))
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": BOS_TOKEN_ID, "do_sample": False, "eos_token_id": EOS_TOKEN_ID},
    )
    (out / "tokenizer.json").write_text(cached_tokenizer_json(), encoding="utf-8")
    _write_json(out / "tokenizer_config.json", qwen3_tokenizer_config(ENDOFTEXT))
    # Provenance goes in its own file: safetensors stores metadata in a hash map whose order,
    # and so the file's bytes, would vary from run to run.
    _write_json(
        out / PROVENANCE_FILE,
        {"preset": preset, "seed": seed, "format_version": FORMAT_VERSION, "spec": asdict(spec)},
    )
    weights = out / "model.safetensors"
    try:
        save_file(random_weights(spec, seed), str(weights), metadata={"format": "pt"})
    except OSError:
        raise
    except Exception as exc:  # safetensors reports a full disk as its own error type
        raise OSError(f"cannot write {weights.name}: {str(exc).strip()[:200]}") from None
    weights.chmod(0o644)


def cache_root() -> Path:
    """``$REPLAYLLM_CACHE`` if set, else ``~/.cache/replayllm``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "replayllm"


def cached_tokenizer_json() -> str:
    """Qwen3's tokenizer.json, built once per rank file and tokenizers version, then reused."""
    import tokenizers

    digest = hashlib.sha256(qwen_tiktoken_path().read_bytes()).hexdigest()[:16]
    path = cache_root() / "tokenizers" / f"qwen3-{digest}-tokenizers{tokenizers.__version__}.json"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    text = build_qwen3_tokenizer_json()
    try:
        _atomic_write_text(path, text)
    except OSError:
        pass  # a read-only cache only costs rebuilding next time
    return text


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def default_model_name() -> str:
    """``tiny-v<format>-<digest of the preset>``: a changed preset never reuses a stale cache."""
    spec = json.dumps(asdict(get_preset(DEFAULT_PRESET)), sort_keys=True)
    digest = hashlib.sha256(spec.encode()).hexdigest()[:8]
    return f"{DEFAULT_PRESET}-v{FORMAT_VERSION}-{digest}"


def default_model_dir() -> Path:
    """The cached tiny model, made on first use.

    It is built in a temporary sibling directory and renamed into place, so a concurrent process
    either sees no directory or a complete one; the loser of a race discards its copy.
    """
    final = cache_root() / "models" / default_model_name()
    if final.is_dir():
        missing = [name for name in _REQUIRED_FILES if not (final / name).is_file()]
        if missing:
            raise ModelLoadError(
                f"cached model {final} is incomplete (missing {', '.join(missing)}); delete it"
            )
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    except OSError as exc:  # a read-only home, or $REPLAYLLM_CACHE naming a file
        from tracing.outdir import describe_os_error

        raise ModelLoadError(
            f"cannot make the tiny model in {final.parent} ({describe_os_error(exc)}); "
            f"set ${CACHE_ENV} to a writable directory") from None
    try:
        make_model(DEFAULT_PRESET, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
