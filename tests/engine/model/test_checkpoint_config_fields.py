"""config.json fields and shard indexes the loader misread, each now one ModelLoadError line
naming the file and the field:

- ``"tie_word_embeddings": "false"`` (a string) was truthy: the model loaded as tied;
- an ``eos_token_id`` that is a string or past the vocabulary was dropped or kept: the engine
  never stopped (a string), or failed later with an error about ``eos`` the user never set;
- a ``quantization_config`` loaded its quantized tensors as plain weights;
- an index whose ``weight_map`` is not an object of file names raised AttributeError/TypeError.

A transformers config.json with fields the engine does not use still loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.errors import ModelLoadError
from engine.model.layers.attention import get_attention_backend
from engine.model.loader import build_model


def load(model_dir: Path) -> torch.nn.Module:
    backend = get_attention_backend("torch", torch.device("cpu"))
    return build_model(model_dir, backend, torch.device("cpu"), torch.float32)


def edit_config(model_dir: Path, **fields: Any) -> Path:
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(fields)
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("name", ["tie_word_embeddings", "attention_bias", "use_sliding_window"])
def test_a_flag_that_is_not_a_json_boolean_is_refused(ckpt: Path, name: str) -> None:
    path = edit_config(ckpt, **{name: "false"})
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert str(exc.value) == f"{path}: {name} must be true or false, got 'false'"


@pytest.mark.parametrize("eos", ["151643", 151936, -1, [151643, "x"], 10**12, True])
def test_an_eos_token_id_that_is_no_token_of_the_vocabulary_is_refused(
    ckpt: Path, eos: object
) -> None:
    path = edit_config(ckpt, eos_token_id=eos)
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert str(exc.value) == (
        f"{path}: eos_token_id must be a token id in [0, 151936) or a list of them, got {eos!r}"
    )


def test_a_list_of_eos_ids_stops_on_the_first(ckpt: Path) -> None:
    edit_config(ckpt, eos_token_id=[151645, 151643])
    assert load(ckpt).spec.eos_token_id == 151645


def test_a_quantized_checkpoint_is_refused(ckpt: Path) -> None:
    path = edit_config(ckpt, quantization_config={"quant_method": "fp8", "fmt": "e4m3"})
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert str(exc.value) == (
        f"{path}: a quantized checkpoint (quantization_config 'fp8') is not supported by the "
        "Qwen3 model"
    )


def test_a_transformers_5_config_with_unused_fields_loads(ckpt: Path) -> None:
    """What transformers 5 writes for Qwen3 (dtype, rope_parameters, layer_types, nulls)."""
    path = ckpt / "config.json"
    cfg = json.loads(path.read_text())
    theta = cfg.pop("rope_theta")
    cfg["dtype"] = cfg.pop("torch_dtype")
    cfg.update(rope_parameters={"rope_theta": theta, "rope_type": "default"},
               layer_types=["full_attention"] * cfg["num_hidden_layers"], sliding_window=None,
               pad_token_id=None, transformers_version="5.0.0", use_sliding_window=False)
    path.write_text(json.dumps(cfg))
    spec = load(ckpt).spec
    assert spec.rope_theta == theta and spec.torch_dtype == cfg["dtype"]


@pytest.mark.parametrize("weight_map", [["model.safetensors"], {"a": 5}, {"a": ""}, "x"])
def test_a_shard_index_whose_weight_map_is_not_file_names_is_refused(
    ckpt: Path, weight_map: object
) -> None:
    index = ckpt / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert str(exc.value) == (
        f"{index}: weight_map must be an object mapping tensor names to weight file names"
    )
