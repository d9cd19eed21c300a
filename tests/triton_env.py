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


# One attention layer of a tiny Qwen3 (4 query heads, 2 KV heads of 16), on pages of 4 tokens.
ATTENTION_LAYER_SHAPE = dict(
    vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
)  # fmt: skip
LAYER_BLOCK_SIZE = 4


def counting_triton_backend() -> object:
    """A Triton attention backend (the interpreter's on CPU) that counts the calls of each of
    its entry points in ``calls``."""
    (module,) = load_kernel_modules("engine.model.layers.attention_triton")

    class Counting(module.TritonAttentionBackend):  # type: ignore[name-defined, misc]
        def __init__(self) -> None:
            super().__init__()
            self.calls = {"store_kv": 0, "forward": 0, "decode_with_prologue": 0}

        def store_kv(self, *args: object) -> None:
            self.calls["store_kv"] += 1
            super().store_kv(*args)

        def forward(self, *args: object) -> torch.Tensor:
            self.calls["forward"] += 1
            return super().forward(*args)

        def decode_with_prologue(self, *args: object) -> torch.Tensor:
            self.calls["decode_with_prologue"] += 1
            return super().decode_with_prologue(*args)

    return Counting()


def run_attention_layer(backend: object, kernels: object, query_lens: list[int],
                        context_lens: list[int], block_tables: list[list[int]],
                        num_prefill: int, filled_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step through one Qwen3 attention layer (``ATTENTION_LAYER_SHAPE``, seeded weights)
    with ``backend`` and ``kernels`` (the fused kernels given to it whatever the device: on CPU
    the interpreter's), over a cache whose first ``filled_blocks`` pages hold random K/V.
    Returns the layer's output and the ``[2, blocks, ...]`` cache, on the CPU."""
    from engine.model import qwen3
    from engine.model.attention_metadata import build_attention_metadata
    from engine.model.layers.parallel import SINGLE_PROCESS
    from engine.model.layers.rotary_embedding import RotaryEmbedding

    spec = qwen3.Qwen3Spec(**ATTENTION_LAYER_SHAPE)  # type: ignore[arg-type]
    torch.manual_seed(0)
    rope = RotaryEmbedding(spec.head_dim, spec.head_dim, 128, 10000.0)
    layer = qwen3.Qwen3Attention(spec, SINGLE_PROCESS, backend, rope, kernels)  # type: ignore[arg-type]
    for p in layer.parameters():
        p.data = 0.2 * torch.randn(p.shape)
    layer = layer.to(DEVICE)
    num_blocks = max(filled_blocks, 1 + max(b for table in block_tables for b in table))
    rows = (num_blocks, LAYER_BLOCK_SIZE, spec.num_key_value_heads, spec.head_dim)
    cache = torch.zeros(2, *rows, device=DEVICE)
    cache[:, :filled_blocks] = torch.randn(2, filled_blocks, *rows[1:])
    layer.attn.bind_kv_cache(cache[0], cache[1])
    positions, md = build_attention_metadata(
        query_lens, context_lens, block_tables, LAYER_BLOCK_SIZE, num_prefill, DEVICE
    )
    hidden = torch.randn(sum(query_lens), spec.hidden_size).to(DEVICE)
    with torch.no_grad():
        out = layer(positions, hidden, md)
    return out.cpu(), cache.cpu()
