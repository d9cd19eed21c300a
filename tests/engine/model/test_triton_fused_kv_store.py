"""The KV-cache store fused into qk_norm_rope: the same cache bytes as qk_norm_rope + store_kv.

Runs compiled on CUDA, else in Triton's interpreter (tiny shapes); skipped without triton. The
layer tests run one Qwen3 attention layer with the Triton backend, fused and not, and compare.
"""

from __future__ import annotations

import pytest
import torch
from triton_env import DEVICE, counting_triton_backend, load_kernel_modules, run_attention_layer

(fused, kv_store, attention_triton) = load_kernel_modules(
    "engine.model.kernels.fused",
    "engine.model.kernels.kv_store",
    "engine.model.layers.attention_triton",
)
load_kernel_modules(
    "engine.model.kernels.paged_attention", "engine.model.kernels.prefill_attention"
)

from engine.model.layers import attention as attention_mod  # noqa: E402
from engine.model.layers.attention_torch import TorchAttentionBackend  # noqa: E402
from engine.model.layers.cuda_kernels import FusedKernels  # noqa: E402
from engine.model.layers.rotary_embedding import RotaryEmbedding  # noqa: E402


def rope_inputs(
    gen: torch.Generator, tokens: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, ...]:
    rope = RotaryEmbedding(head_dim, head_dim, 64, 10000.0)
    qkv = torch.randn(tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen)
    q_w = 1 + 0.1 * torch.randn(head_dim, generator=gen)
    k_w = 1 + 0.1 * torch.randn(head_dim, generator=gen)
    positions = torch.randint(0, 64, (tokens,), generator=gen)
    return qkv, q_w, k_w, rope.cos_cache, rope.sin_cache, positions


F32, BF16 = torch.float32, torch.bfloat16


# (3, 1, 24): head halves padded to a power of two; (F32, BF16): the store converts.
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim,act_dtype,cache_dtype",
    [(4, 2, 16, F32, F32), (4, 2, 16, BF16, BF16), (4, 2, 16, F32, BF16), (3, 1, 24, F32, F32)],
)
def test_fused_store_writes_what_store_kv_writes(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    act_dtype: torch.dtype,
    cache_dtype: torch.dtype,
) -> None:
    gen = torch.Generator().manual_seed(num_heads * 10 + head_dim)
    tokens, num_blocks, block_size = 7, 5, 4
    qkv, q_w, k_w, cos, sin, positions = rope_inputs(gen, tokens, num_heads, num_kv_heads, head_dim)
    qkv, q_w, k_w = qkv.to(act_dtype), q_w.to(act_dtype), k_w.to(act_dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[[1, 4]] = -1  # padding tokens of a CUDA-graph batch: nothing is written
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.full(shape, float("nan"), dtype=cache_dtype).to(DEVICE) for _ in range(4)]
    args = [t.to(DEVICE) for t in (qkv, q_w, k_w, cos, sin, positions)]
    meta = (num_heads, num_kv_heads, head_dim, 1e-6)
    slots = slots.to(DEVICE)
    q1, k1, v1 = fused.qk_norm_rope(
        *args, *meta, k_cache=caches[0], v_cache=caches[1], slot_mapping=slots
    )
    q2, k2, v2 = fused.qk_norm_rope(*args, *meta)
    kv_store.store_kv(k2, v2, caches[2], caches[3], slots)
    assert torch.equal(q1, q2) and torch.equal(k1, k2) and torch.equal(v1, v2)
    for ours, ref in ((caches[0], caches[2]), (caches[1], caches[3])):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0, equal_nan=True)
    flat = caches[0].view(-1, num_kv_heads, head_dim).cpu()
    written = torch.zeros(flat.shape[0], dtype=torch.bool)
    written[slots[slots >= 0].cpu()] = True
    assert not torch.isnan(flat[written]).any()
    assert torch.isnan(flat[~written]).all()  # padding rows and unused slots untouched


def test_fused_store_rejects_mismatched_caches() -> None:
    gen = torch.Generator().manual_seed(1)
    args = [t.to(DEVICE) for t in rope_inputs(gen, 3, 2, 1, 8)]
    cache = torch.zeros(2, 4, 2, 8, device=DEVICE)  # 2 kv heads, the model has 1
    with pytest.raises(ValueError):
        fused.qk_norm_rope(
            *args, 2, 1, 8, 1e-6, k_cache=cache, v_cache=cache,
            slot_mapping=torch.zeros(3, dtype=torch.int64, device=DEVICE),
        )  # fmt: skip


# --- the attention layer -----------------------------------------------------------------------

def run_layer(
    fuse: bool, backend: object, kernels: FusedKernels | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One mixed step through one attention layer: seq 0 has 3 new tokens after 8 cached
    (blocks 0, 1), seq 1 a fresh 5, seq 2 a decode at position 5."""
    if kernels is None:
        kernels = FusedKernels(fused, kv_store=fuse)
    tables = [[0, 1, 2], [3, 4], [5, 6]]
    return run_attention_layer(backend, kernels, [3, 5, 1], [11, 5, 6], tables, 2, 2)


def test_layer_with_fused_store_matches_separate_store() -> None:
    fused_backend, plain_backend = counting_triton_backend(), counting_triton_backend()
    kernels = FusedKernels(fused, kv_store=True)
    out_fused, cache_fused = run_layer(True, fused_backend, kernels)
    out_plain, cache_plain = run_layer(False, plain_backend)
    assert fused_backend.calls["store_kv"] == 0 and plain_backend.calls["store_kv"] == 1
    assert kernels.store.checked and kernels.store.usable
    assert torch.equal(cache_fused, cache_plain)
    assert torch.equal(out_fused, out_plain)


def test_layer_falls_back_when_the_fused_store_fails() -> None:
    class Broken:
        @staticmethod
        def qk_norm_rope(*args: object, **kwargs: object) -> object:
            if kwargs:
                raise RuntimeError("no such kernel")
            return fused.qk_norm_rope(*args)

    backend = counting_triton_backend()
    kernels = FusedKernels(Broken, kv_store=True)  # type: ignore[arg-type]
    with pytest.warns(RuntimeWarning, match="fused KV store unavailable"):
        out, cache = run_layer(True, backend, kernels)
    assert backend.calls["store_kv"] == 1 and not kernels.store.usable and not kernels.store.checked
    ref_out, ref_cache = run_layer(False, counting_triton_backend())
    assert torch.equal(cache, ref_cache) and torch.equal(out, ref_out)


def test_only_backends_that_allow_it_fuse() -> None:
    cache = torch.zeros(3, 4, 2, 8)
    torch_layer = attention_mod.Attention(4, 8, 1.0, 2, TorchAttentionBackend(), fuse_kv_store=True)
    torch_layer.bind_kv_cache(cache, cache)
    assert torch_layer.fused_kv_store_target() is None  # the PyTorch backend stores itself
    triton_layer = attention_mod.Attention(
        4, 8, 1.0, 2, attention_triton.TritonAttentionBackend(), fuse_kv_store=True
    )
    assert triton_layer.fused_kv_store_target() is None  # no cache bound (a profiling run)
    triton_layer.bind_kv_cache(cache, cache)
    assert triton_layer.fused_kv_store_target() is not None
    triton_layer.fuse_kv_store = False
    assert triton_layer.fused_kv_store_target() is None
    assert attention_mod.Attention(4, 8, 1.0, 2, TorchAttentionBackend()).fuse_kv_store
