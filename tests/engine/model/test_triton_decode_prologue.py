"""The decode attention kernel's QK prologue (``Config.decode_qk_prologue``): starting from the
QKV rows, it writes the caches ``qk_norm_rope`` + ``store_kv`` write and returns the attention
they lead to, and the layer takes it only where it applies.

Runs compiled on CUDA (values to bf16 rounding: the norm's sum may round differently in another
tile shape), else in Triton's interpreter (tiny shapes, bit-identical); skipped without triton.
"""

from __future__ import annotations

import pytest
import torch
from triton_env import (
    DEVICE,
    HAS_CUDA,
    counting_triton_backend,
    load_kernel_modules,
    run_attention_layer,
)

(fused, kv_store, paged, attention_triton) = load_kernel_modules(
    "engine.model.kernels.fused",
    "engine.model.kernels.kv_store",
    "engine.model.kernels.paged_attention",
    "engine.model.layers.attention_triton",
)
load_kernel_modules(
    "engine.model.kernels.decode_prologue", "engine.model.kernels.prefill_attention"
)
# paged_attention bound the prologue helpers at its import: reload it after them.
(paged,) = load_kernel_modules("engine.model.kernels.paged_attention")

from engine.model.attention_metadata import QkNormRope  # noqa: E402
from engine.model.layers.cuda_kernels import FusedKernels  # noqa: E402
from engine.model.layers.rotary_embedding import RotaryEmbedding  # noqa: E402

F32, BF16 = torch.float32, torch.bfloat16


def assert_same(ours: torch.Tensor, ref: torch.Tensor) -> None:
    if HAS_CUDA and ours.dtype != torch.float32:
        torch.testing.assert_close(ours.float(), ref.float(), rtol=1.6e-2, atol=1e-2)
    elif HAS_CUDA:
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(ours, ref)


def decode_batch(gen: torch.Generator, context_lens: list[int], block_size: int, width: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block tables (disjoint, shuffled pages), int32 context lengths, each row's position and
    slot (a padding row, context 0: position 0, slot -1)."""
    rows = len(context_lens)
    pages = torch.randperm(rows * width, generator=gen).to(torch.int32).reshape(rows, width)
    ctx = torch.tensor(context_lens, dtype=torch.int32)
    last = (ctx.long() - 1).clamp(min=0)
    slots = pages[torch.arange(rows), last // block_size].long() * block_size + last % block_size
    slots = torch.where(ctx > 0, slots, torch.full_like(slots, -1))
    return pages, ctx, last, slots


# Splits 1, 2 and 4 over contexts of 1 to 300 tokens (one split holding the new token, the others
# reading only old ones), a padding row, GQA groups of 1 and 4, float32 and bf16.
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(4, 2, 32), (4, 4, 16), (8, 2, 32)])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("ordered", [False, True])
def test_prologue_writes_and_reads_what_the_separate_kernels_do(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, splits: int,
    ordered: bool,
) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(num_heads * 100 + head_dim + splits)
    block_size, width = 4, 80
    context_lens = [300, 1, 0, 65, 9] if HAS_CUDA else [70, 1, 0, 9]
    pages, ctx, positions, slots = decode_batch(gen, context_lens, block_size, width)
    rows = len(context_lens)
    rope = RotaryEmbedding(head_dim, head_dim, 512, 10000.0)
    qkv = torch.randn(rows, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    q_w = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(dtype)
    k_w = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(dtype)
    shape = (rows * width, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    ours_k, ours_v = k_cache.clone().to(DEVICE), v_cache.clone().to(DEVICE)
    ref_k, ref_v = k_cache.to(DEVICE), v_cache.to(DEVICE)
    qkv, q_w, k_w, pages, ctx = (t.to(DEVICE) for t in (qkv, q_w, k_w, pages, ctx))
    positions, slots = positions.to(DEVICE), slots.to(DEVICE)
    cos, sin = rope.cos_cache.to(DEVICE), rope.sin_cache.to(DEVICE)
    order = torch.argsort(ctx, descending=True).to(torch.int32) if ordered else None
    scale = head_dim**-0.5

    q, k, v = fused.qk_norm_rope(
        qkv, q_w, k_w, cos, sin, positions, num_heads, num_kv_heads, head_dim, 1e-6
    )
    kv_store.store_kv(k, v, ref_k, ref_v, slots)
    ref = paged.paged_decode_attention(q, ref_k, ref_v, pages, ctx, scale, num_splits=splits,
                                       order=order)  # fmt: skip
    prologue = QkNormRope(q_w, k_w, cos, sin, positions, slots, 1e-6)
    query = qkv[:, : num_heads * head_dim].view(rows, num_heads, head_dim)
    ours = paged.paged_decode_attention(
        query, ours_k, ours_v, pages, ctx, scale, num_splits=splits, order=order,
        prologue=prologue,
    )  # fmt: skip
    assert_same(ours_k, ref_k)
    assert torch.equal(ours_v, ref_v)  # V is copied, never computed
    assert_same(ours, ref)
    assert not ours[2].any()  # the padding row: zeros, and nothing stored for it


def test_a_one_row_step_takes_the_prologue_whatever_its_view_strides() -> None:
    """A one-row view of QKV reports the row stride of the query part alone (a size-1
    dimension's stride is arbitrary): the engine's one-sequence decode graph passes such a q."""
    qkv = torch.randn(1, (4 + 2 * 2) * 32, device=DEVICE)
    q = qkv[:, : 4 * 32].view(-1, 4, 32)
    cache = torch.zeros(8, 4, 2, 32, device=DEVICE)
    table = torch.zeros(1, 2, dtype=torch.int32, device=DEVICE)
    ctx = torch.ones(1, dtype=torch.int32, device=DEVICE)
    zeros = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    ones = torch.ones(32, device=DEVICE)
    rope = RotaryEmbedding(32, 32, 8, 10000.0)
    cos, sin = rope.cos_cache.to(DEVICE), rope.sin_cache.to(DEVICE)
    prologue = QkNormRope(ones, ones, cos, sin, zeros, zeros, 1e-6)
    out = paged.paged_decode_attention(q, cache, cache.clone(), table, ctx, 1.0, prologue=prologue)
    # One token of context: the output is its V, copied from the QKV row into the cache.
    assert_same(out, qkv[:, 6 * 32 :].view(1, 2, 32).repeat_interleave(2, dim=1))


def test_prologue_refuses_a_query_that_is_not_part_of_qkv_rows() -> None:
    q = torch.zeros(2, 4, 32, device=DEVICE)  # contiguous q: no K/V heads follow its rows
    cache = torch.zeros(8, 4, 2, 32, device=DEVICE)
    table = torch.zeros(2, 2, dtype=torch.int32, device=DEVICE)
    ctx = torch.ones(2, dtype=torch.int32, device=DEVICE)
    zeros = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    prologue = QkNormRope(q[0, 0], q[0, 0], q[0], q[0], zeros, zeros, 1e-6)
    with pytest.raises(ValueError, match="QK prologue"):
        paged.paged_decode_attention(q, cache, cache, table, ctx, 1.0, prologue=prologue)


def test_prologue_needs_a_power_of_two_head() -> None:
    assert paged.prologue_fits(128) and paged.prologue_fits(16)
    assert not paged.prologue_fits(24) and not paged.prologue_fits(8)


# --- the attention layer -----------------------------------------------------------------------

def broken_prologue_backend() -> object:
    """A counting backend whose decode-from-QKV entry point raises (a kernel that fails)."""
    backend = counting_triton_backend()

    def broken(*args: object) -> torch.Tensor:
        backend.calls["decode_with_prologue"] += 1  # type: ignore[attr-defined]
        raise RuntimeError("no such kernel")

    backend.decode_with_prologue = broken  # type: ignore[attr-defined]
    return backend


def run_layer(prologue: bool, backend: object, decode_only: bool,
              kernels: FusedKernels | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One step through one attention layer: three decodes (at positions 6, 11 and 1), or a
    prefill of 3 tokens after 8 cached (pages 6-8) before two of them."""
    if kernels is None:
        kernels = FusedKernels(fused, decode_qk_prologue=prologue)
    if decode_only:
        return run_attention_layer(
            backend, kernels, [1, 1, 1], [7, 12, 2], [[0, 1], [2, 3, 4], [5]], 0, 8
        )
    tables = [[6, 7, 8], [0, 1], [2, 3, 4]]
    return run_attention_layer(backend, kernels, [3, 1, 1], [11, 7, 12], tables, 1, 8)


def test_a_decode_step_takes_the_prologue_and_matches_the_separate_kernels() -> None:
    ours_backend, plain_backend = counting_triton_backend(), counting_triton_backend()
    kernels = FusedKernels(fused, decode_qk_prologue=True)
    out, cache = run_layer(True, ours_backend, True, kernels)
    ref_out, ref_cache = run_layer(False, plain_backend, True)
    assert ours_backend.calls == {"store_kv": 0, "forward": 0, "decode_with_prologue": 1}
    assert plain_backend.calls["decode_with_prologue"] == 0
    assert kernels.prologue.checked and kernels.prologue.usable
    assert_same(cache, ref_cache)
    assert_same(out, ref_out)


def test_a_step_with_a_prefill_keeps_qk_norm_rope() -> None:
    backend = counting_triton_backend()
    out, cache = run_layer(True, backend, False)
    ref_out, ref_cache = run_layer(False, counting_triton_backend(), False)
    assert backend.calls["decode_with_prologue"] == 0 and backend.calls["forward"] == 1
    assert torch.equal(cache, ref_cache) and torch.equal(out, ref_out)


def test_a_failing_prologue_is_turned_off_and_the_step_still_runs() -> None:
    backend = broken_prologue_backend()
    kernels = FusedKernels(fused, decode_qk_prologue=True)
    with pytest.warns(RuntimeWarning, match="decode QK prologue unavailable"):
        out, cache = run_layer(True, backend, True, kernels)
    assert not kernels.prologue.usable and backend.calls["forward"] == 1
    ref_out, ref_cache = run_layer(False, counting_triton_backend(), True)
    assert torch.equal(cache, ref_cache) and torch.equal(out, ref_out)
    run_layer(True, backend, True, kernels)  # turned off: not tried again
    assert backend.calls["decode_with_prologue"] == 1
