"""Checkpoints whose tensors hold values the engine cannot serve fail at load, in one
ModelLoadError line naming the tensor, instead of loading and generating garbage:

- a NaN or an infinity in any weight (before: loaded silently; every logit became NaN);
- a value the serving dtype overflows on (1e6 served in float16 became an infinity);
- a float8 tensor, a quantized checkpoint's (before: silently cast, its scales never applied).

The check is one ``torch.aminmax`` per tensor in its stored dtype (NaN and infinities
propagate through min and max), so it is always on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import ModelLoadError
from engine.model import loader
from engine.model.layers.attention import get_attention_backend
from engine.model.loader import build_model

TENSOR = "model.layers.1.self_attn.q_proj.weight"


def load(model_dir: Path, dtype: torch.dtype = torch.float32) -> None:
    backend = get_attention_backend("torch", torch.device("cpu"))
    build_model(model_dir, backend, torch.device("cpu"), dtype)


def set_value(model_dir: Path, value: float, at: tuple[int, int] = (5, 7)) -> None:
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    tensors[TENSOR][at] = value
    save_file(tensors, str(path))


@pytest.mark.parametrize(("value", "kind"), [
    (float("nan"), "NaN"), (float("inf"), "infinite"), (float("-inf"), "infinite")])
def test_a_nan_or_infinite_weight_is_refused_naming_the_tensor(
    ckpt: Path, value: float, kind: str
) -> None:
    set_value(ckpt, value)
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt)
    assert str(exc.value) == (
        f"tensor '{TENSOR}' in {ckpt / 'model.safetensors'} holds 1 {kind} value(s) "
        "(the first at [5, 7]): the checkpoint is corrupt"
    )


def test_a_value_float16_cannot_hold_is_refused_only_when_served_in_float16(ckpt: Path) -> None:
    set_value(ckpt, 1e6)
    load(ckpt, torch.float32)  # a large weight is no error where it fits
    with pytest.raises(ModelLoadError) as exc:
        load(ckpt, torch.float16)
    message = str(exc.value)
    assert "\n" not in message and TENSOR in message
    assert "overflow float16 (largest 65504)" in message


def test_a_float8_tensor_is_refused(ckpt: Path) -> None:
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    tensors[TENSOR] = tensors[TENSOR].to(torch.float8_e4m3fn)
    save_file(tensors, str(path))
    with pytest.raises(ModelLoadError, match=f"'{TENSOR}' .* has dtype float8_e4m3fn, not a "):
        load(ckpt)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("size", [1, 15, 16, 17, 1000, 4099])
def test_the_check_finds_a_bad_value_at_every_position(dtype: torch.dtype, size: int) -> None:
    """aminmax's vectorized body and its tail both propagate NaN and infinities (the check
    relies on it); an all-finite tensor passes."""
    loader.check_finite(torch.randn(size).to(dtype), dtype, "t")
    loader.check_finite(torch.zeros(0, dtype=dtype), dtype, "t")  # an empty tensor has no bad value
    for position in sorted({0, size // 2, size - 1}):
        for bad in (float("nan"), float("inf"), float("-inf")):
            tensor = torch.randn(size).to(dtype)
            tensor[position] = bad
            with pytest.raises(ModelLoadError, match=rf"the first at \[{position}\]"):
                loader.check_finite(tensor, dtype, "t")
