"""Checkpoints whose files are all there but whose contents the engine cannot run fail at load
in one ModelLoadError line naming the tensor or field, instead of loading and generating
garbage (an integer or boolean tensor was cast into the float weights) or failing deep in the
model's construction with a bare ValueError traceback (a head count the KV heads do not
divide)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import ModelLoadError
from engine.model.layers.attention import get_attention_backend
from engine.model.loader import build_model

TENSOR = "model.layers.0.mlp.down_proj.weight"


def load(model_dir: Path) -> None:
    backend = get_attention_backend("torch", torch.device("cpu"))
    build_model(model_dir, backend, torch.device("cpu"), torch.float32)


def rewrite_tensor(model_dir: Path, change: object) -> None:
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    tensors[TENSOR] = change(tensors[TENSOR])  # type: ignore[operator]
    save_file(tensors, str(path))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool])
def test_a_tensor_that_is_not_floating_point_is_refused(ckpt: Path, dtype: torch.dtype) -> None:
    rewrite_tensor(ckpt, lambda t: (t * 100).to(dtype))
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    message = str(exc.value)
    assert "\n" not in message
    assert TENSOR in message and str(dtype).removeprefix("torch.") in message
    assert "floating-point" in message


def test_float64_and_bfloat16_tensors_still_load(ckpt: Path) -> None:
    """Floating-point checkpoints of another precision are cast, as before."""
    rewrite_tensor(ckpt, lambda t: t.double())
    load(ckpt)
    rewrite_tensor(ckpt, lambda t: t.bfloat16())
    load(ckpt)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 3), (4, 8), (3, 2)])
def test_kv_heads_that_do_not_divide_the_heads_name_config_json(
    ckpt: Path, heads: int, kv_heads: int
) -> None:
    path = ckpt / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(num_attention_heads=heads, num_key_value_heads=kv_heads)
    path.write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert str(exc.value) == (
        f"{path}: num_attention_heads ({heads}) must be a multiple of "
        f"num_key_value_heads ({kv_heads})"
    )


def test_a_tensor_held_by_two_files_is_refused(ckpt: Path) -> None:
    """A stale copy beside the checkpoint (no shard index) silently replaced the weights it
    held: the file sorted last won and the model generated other tokens."""
    tensors = load_file(str(ckpt / "model.safetensors"))
    save_file({TENSOR: tensors[TENSOR] * 0 + 0.5}, str(ckpt / "z-backup.safetensors"))
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert str(exc.value) == (
        f"tensor '{TENSOR}' is in both {ckpt / 'model.safetensors'} and "
        f"{ckpt / 'z-backup.safetensors'}: remove the file that does not belong to the checkpoint"
    )


def test_with_a_shard_index_only_the_files_it_names_are_read(ckpt: Path) -> None:
    """As transformers: a stray file beside an indexed checkpoint is not part of it."""
    tensors = load_file(str(ckpt / "model.safetensors"))
    index = {"metadata": {}, "weight_map": dict.fromkeys(tensors, "model.safetensors")}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    save_file({TENSOR: tensors[TENSOR] * 0 + 0.5}, str(ckpt / "z-stale.safetensors"))
    backend = get_attention_backend("torch", torch.device("cpu"))
    model = build_model(ckpt, backend, torch.device("cpu"), torch.float32)
    loaded = dict(model.named_parameters())["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(loaded, tensors[TENSOR])
