"""Load a Hugging Face checkpoint directory (config.json + *.safetensors) into an engine model.

Every way a checkpoint can be unusable ends in one ModelLoadError line naming the file or tensor:
no directory, no config.json, invalid JSON, an unsupported architecture, no weight file, a shard
index whose ``weight_map`` is not an object of file names, a file the index names but that is
absent, an unreadable file, an unexpected, misshapen or missing tensor, a tensor that is not
float32, bfloat16, float16 or float64 or that two files hold, and a tensor holding a NaN or an
infinity, or a value the serving dtype cannot hold (float16's 65504).

The finiteness check is always on: one ``torch.aminmax`` per tensor, in its stored dtype, as it
is loaded (NaN and infinities propagate through min and max; no temporary is made): 0.4-1.8 s
over the 596M values of Qwen3-0.6B on a 2-core CPU, about a third of the load, where
``torch.isfinite(t).all()`` took 17 s. It runs on rank 0 alone (every rank reads the same files).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from engine.config import Config
from engine.errors import ModelLoadError
from engine.model.layers.attention import AttentionBackend
from engine.model.layers.cuda_kernels import FusedKernels, kernels_for
from engine.model.layers.linear import default_weight_loader
from engine.model.layers.parallel import SINGLE_PROCESS, ParallelGroup
from engine.model.registry import get_model_class, resolve_architecture

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
# Checkpoint tensors some exporters include that the engine derives itself.
_DERIVED_SUFFIXES = ("rotary_emb.inv_freq",)
# The stored dtypes the engine casts from: a float8 tensor is one of a quantized checkpoint's
# (its scales live in other tensors the engine does not apply), as integer ones are.
LOADABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_model_dir(model_dir: str | Path) -> Path:
    path = Path(model_dir).expanduser()
    if not path.is_dir():
        raise ModelLoadError(f"model directory {path} does not exist or is not a directory")
    return path


def read_json(path: Path, what: str) -> dict[str, Any]:
    """Parse a JSON object from ``path``; errors name the file and the position."""
    if not path.is_file():
        raise ModelLoadError(f"missing {path.name} in {path.parent}: {what}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_hf_config(model_dir: str | Path) -> dict[str, Any]:
    """The checkpoint's ``config.json`` as a dict."""
    path = check_model_dir(model_dir)
    return read_json(path / CONFIG_FILE, "not a Hugging Face checkpoint directory")


def weight_files(model_dir: str | Path) -> list[Path]:
    """The ``*.safetensors`` files to load, sorted: those the shard index names if there is one
    (as transformers: another file there, a stale shard, is not read), else every one."""
    path = check_model_dir(model_dir)
    index_path = path / WEIGHTS_INDEX_FILE
    if index_path.is_file():
        weight_map = read_json(index_path, "shard index").get("weight_map", {})
        if not isinstance(weight_map, dict) or not all(
                isinstance(shard, str) and shard for shard in weight_map.values()):
            raise ModelLoadError(f"{index_path}: weight_map must be an object mapping tensor "
                                 "names to weight file names")
        shards = [path / shard for shard in sorted(set(weight_map.values()))]
        for shard in shards:
            if not shard.is_file():
                raise ModelLoadError(f"missing weight file {shard} (listed in {index_path})")
        if shards:
            return shards
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"missing weight file {path / WEIGHTS_FILE}: no *.safetensors file in {path}"
        )
    return files


def _checkpoint_to_param(
    name: str, packed: dict[str, tuple[str, str | int]]
) -> tuple[str, str | int | None]:
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in packed:
            target, shard_id = packed[part]
            parts[i] = target
            return ".".join(parts), shard_id
    return name, None


def _expected_shards(
    model: nn.Module, packed: dict[str, tuple[str, str | int]]
) -> dict[str, dict[str | int | None, str]]:
    """For each parameter: shard id -> checkpoint tensor name that must supply it."""
    by_target: dict[str, list[tuple[str, str | int]]] = defaultdict(list)
    for source, (target, shard_id) in packed.items():
        by_target[target].append((source, shard_id))
    expected: dict[str, dict[str | int | None, str]] = {}
    for name, _ in model.named_parameters():  # tied parameters appear once
        parts = name.split(".")
        module = parts[-2] if len(parts) >= 2 else ""
        if module in by_target:
            expected[name] = {
                shard_id: ".".join(parts[:-2] + [source, parts[-1]])
                for source, shard_id in by_target[module]
            }
        else:
            expected[name] = {None: name}
    return expected


def load_weights(model: nn.Module, model_dir: str | Path, check_values: bool = True) -> None:
    """Copy every checkpoint tensor into ``model`` through its parameter's ``weight_loader``.

    ``check_values``: refuse a tensor holding a NaN or an infinity, or a value the parameter's
    dtype overflows on (``check_finite``); a TP worker leaves it to rank 0."""
    path = check_model_dir(model_dir)
    packed: dict[str, tuple[str, str | int]] = getattr(model, "packed_modules_mapping", {})
    tied = bool(getattr(getattr(model, "spec", None), "tie_word_embeddings", False))
    params = dict(model.named_parameters())
    expected = _expected_shards(model, packed)
    loaded: dict[str, set[str | int | None]] = defaultdict(set)
    found_in: dict[str, Path] = {}  # a tensor in two files: which one wins is no rule to keep
    arch = type(model).__name__
    for file in weight_files(path):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for tensor_name in f.keys():
                    if (other := found_in.setdefault(tensor_name, file)) != file:
                        raise ModelLoadError(
                            f"tensor {tensor_name!r} is in both {other} and {file}: remove the "
                            "file that does not belong to the checkpoint"
                        )
                    param_name, shard_id = _checkpoint_to_param(tensor_name, packed)
                    param = params.get(param_name)
                    if param is None:
                        if tensor_name.endswith(_DERIVED_SUFFIXES):
                            continue
                        if tied and tensor_name == "lm_head.weight":
                            continue  # tied: the embedding table is the LM head
                        raise ModelLoadError(
                            f"unexpected tensor {tensor_name!r} in {file}: {arch} has no "
                            f"parameter {param_name!r}"
                        )
                    tensor = f.get_tensor(tensor_name)
                    _load_one(param, tensor, shard_id, tensor_name, file)
                    if check_values:
                        check_finite(tensor, param.dtype, f"tensor {tensor_name!r} in {file}")
                    loaded[param_name].add(shard_id)
        except SafetensorError as exc:
            raise ModelLoadError(f"cannot read weight file {file}: {exc}") from None
    missing = [
        tensor
        for name, shards in expected.items()
        for shard_id, tensor in shards.items()
        if shard_id not in loaded[name]
    ]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(
            f"tensor {missing[0]!r} is missing from the checkpoint in {path}{more}"
        )


def _load_one(
    param: nn.Parameter,
    tensor: torch.Tensor,
    shard_id: str | int | None,
    tensor_name: str,
    file: Path,
) -> None:
    if tensor.dtype not in LOADABLE_DTYPES:  # quantized or foreign data: copy_ would cast it
        raise ModelLoadError(
            f"tensor {tensor_name!r} in {file} has dtype {str(tensor.dtype).removeprefix('torch.')}"
            ", not a floating-point type the engine loads: float32, bfloat16 or float16 weights"
        )
    weight_loader = getattr(param, "weight_loader", default_weight_loader)
    try:
        if shard_id is None:
            weight_loader(param, tensor)
        else:
            weight_loader(param, tensor, shard_id)
    except ValueError as exc:
        raise ModelLoadError(f"cannot load tensor {tensor_name!r} from {file}: {exc}") from None


def check_finite(tensor: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Refuse ``tensor`` (``what`` names it) if it holds a NaN or an infinity, or a value that
    ``dtype`` (the parameter it is cast into) rounds to an infinity.

    One ``aminmax`` pass in the stored dtype: a NaN makes both results NaN, an infinity the
    max or the min, so two finite results prove every value finite. Only a failing tensor is
    read again, to count its values and place the first."""
    if tensor.numel() == 0:
        return
    low, high = torch.aminmax(tensor)
    if math.isfinite(lowest := low.item()) and math.isfinite(highest := high.item()):
        served = torch.stack((low, high)).to(dtype)
        if bool(torch.isfinite(served).all()):
            return
        name = str(dtype).removeprefix("torch.")
        raise ModelLoadError(
            f"{what} holds values ({lowest:.6g} to {highest:.6g}) that overflow {name} "
            f"(largest {torch.finfo(dtype).max:.6g}): serve it in another dtype"
        )
    bad = ~torch.isfinite(tensor)
    first = [int(i) for i in bad.nonzero()[0]]
    kinds = " and ".join(kind for kind, found in (
        ("NaN", bool(torch.isnan(tensor).any())), ("infinite", bool(torch.isinf(tensor).any())))
        if found)
    raise ModelLoadError(
        f"{what} holds {int(bad.sum())} {kinds} value(s) (the first at {first}): the checkpoint "
        "is corrupt"
    )


def build_model(
    model_dir: str | Path,
    backend: AttentionBackend,
    device: torch.device,
    dtype: torch.dtype,
    group: ParallelGroup = SINGLE_PROCESS,
    kernels: FusedKernels | None = None,
    max_positions: int | None = None,
) -> nn.Module:
    """Instantiate the checkpoint's architecture on ``device`` in ``dtype`` and load weights.

    ``max_positions``: the most positions a run reaches (``Config.max_model_len``): the rotary
    table holds no more, whatever the checkpoint's ``max_position_embeddings``; None: those.

    ``kernels``: the fused kernels its layers use; None: those of ``Config()``'s defaults on
    ``device`` (``kernels_for``: the fused Triton kernels on CUDA, the PyTorch code elsewhere).
    """
    if kernels is None:
        kernels = kernels_for(Config(), device)
    path = check_model_dir(model_dir)
    hf_config = read_hf_config(path)
    model_cls = get_model_class(resolve_architecture(hf_config, str(path / CONFIG_FILE)))
    spec = model_cls.spec_class.from_hf_config(hf_config, str(path / CONFIG_FILE))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are created in the serving dtype directly
    try:
        with torch.device(device):
            model = model_cls(spec, backend, group, kernels, max_positions)
    finally:
        torch.set_default_dtype(previous)
    load_weights(model, path, check_values=group.rank == 0)
    return model.eval()
