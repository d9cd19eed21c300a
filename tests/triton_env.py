"""Where the Triton kernel tests run: compiled on CUDA, else in Triton's interpreter on CPU.

Import this before any kernel module. Without triton the importing test module is skipped.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before the kernels are decorated: triton.jit picks the interpreter then.
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton", reason="triton is not installed (CPU CI has none)")
DEVICE = "cuda" if HAS_CUDA else "cpu"


def _interpreter_numpy2_shim() -> None:
    """Let the interpreter run loops with run-time bounds under numpy 2.

    Triton 3.6's interpreter holds scalars as 1-element arrays and converts them for ``range``
    with ``int(array)``, which numpy 2 refuses for arrays of rank 1; ``.item()`` is the same value.
    Compiled kernels are unaffected.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "numpy2_shim", False):
        return

    def patch(tensor: type, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch.numpy2_shim = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patch


def load_kernel_modules(*names: str) -> list[ModuleType]:
    """Import the kernel modules, decorated for the interpreter when there is no CUDA."""
    modules = [importlib.import_module(name) for name in names]
    if not HAS_CUDA:
        _interpreter_numpy2_shim()
        # Another test may have imported them before the interpreter switch: decorate again.
        modules = [importlib.reload(module) for module in modules]
    return modules


def load_attention_backend_module() -> ModuleType:
    """``engine.model.layers.attention_triton`` with every kernel module it calls, ready."""
    (module,) = load_kernel_modules("engine.model.layers.attention_triton")
    load_kernel_modules(
        "engine.model.kernels.kv_store",
        "engine.model.kernels.paged_attention",
        "engine.model.kernels.prefill_attention",
    )
    return module


def tiny_model_with_cache(backend: object, block_size: int, num_blocks: int
                          ) -> tuple[torch.nn.Module, torch.Tensor]:
    """The embedded tiny model in float32 on ``DEVICE`` with ``backend``, and a zeroed KV cache
    ``[2, layers, num_blocks, block_size, kv_heads, head_dim]`` bound to its attention layers."""
    from engine.model.checkpoint import default_model_dir
    from engine.model.loader import build_model

    device = torch.device(DEVICE)
    model = build_model(default_model_dir(), backend, device, torch.float32)
    layers = model.attention_layers
    cache = torch.zeros(
        2, len(layers), num_blocks, block_size, layers[0].num_kv_heads, model.spec.head_dim,
        device=device,
    )  # fmt: skip
    for i, layer in enumerate(layers):
        layer.bind_kv_cache(cache[0, i], cache[1, i])
    return model, cache
