"""Unusable checkpoints fail with one ModelLoadError line that names the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import Config
from engine.errors import ModelLoadError
from engine.model.layers.attention import get_attention_backend
from engine.model.loader import build_model
from engine.model.tokenizer import load_tokenizer
from engine.runner.model_runner import ModelRunner


def load(model_dir: Path) -> None:
    backend = get_attention_backend("torch", torch.device("cpu"))
    build_model(model_dir, backend, torch.device("cpu"), torch.float32)


def one_line(exc: pytest.ExceptionInfo[ModelLoadError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def edit_config(model_dir: Path, **changes: object) -> None:
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def test_unknown_architecture_names_it_and_the_supported_ones(ckpt: Path) -> None:
    edit_config(ckpt, architectures=["LlamaForCausalLM"])
    with pytest.raises(ModelLoadError) as exc:
        ModelRunner(Config(model=str(ckpt), num_kvcache_blocks=4))
    message = one_line(exc)
    assert "LlamaForCausalLM" in message and "supported: Qwen3ForCausalLM" in message


def test_missing_weight_file(ckpt: Path) -> None:
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert "missing weight file" in one_line(exc) and "model.safetensors" in str(exc.value)


def test_missing_config(ckpt: Path) -> None:
    (ckpt / "config.json").unlink()
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert "missing config.json" in one_line(exc)


def test_missing_tensor_is_named(ckpt: Path) -> None:
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(path))
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert "'model.layers.1.mlp.up_proj.weight' is missing" in one_line(exc)


def test_misshapen_tensor_names_tensor_and_shapes(ckpt: Path) -> None:
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(3, 64)
    save_file(tensors, str(path))
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    message = one_line(exc)
    assert "model.layers.0.self_attn.k_proj.weight" in message and "(3, 64)" in message


def test_unexpected_tensor(ckpt: Path) -> None:
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(path))
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert "unexpected tensor 'model.layers.0.mlp.extra.weight'" in one_line(exc)


def test_corrupt_weight_file(ckpt: Path) -> None:
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert "cannot read weight file" in one_line(exc) and "model.safetensors" in str(exc.value)


def test_invalid_json_and_bad_fields(ckpt: Path) -> None:
    edit_config(ckpt, hidden_size=0)
    with pytest.raises(ModelLoadError, match="hidden_size must be a positive integer"):
        load(ckpt)
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"config.json is not valid JSON \(line 1"):
        load(ckpt)


def test_missing_directory_and_tokenizer(tmp_path: Path, ckpt: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load(tmp_path / "nowhere")
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="missing tokenizer.json"):
        load_tokenizer(ckpt)


def test_shard_index_naming_an_absent_file(ckpt: Path) -> None:
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="missing weight file .*model-00002-of-00002"):
        load(ckpt)
