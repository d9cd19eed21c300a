"""The decode attention's inline merge (``Config.decode_inline_merge``): the last split program of
each row merges the partials as the merge kernel does, and leaves the arrival counters at zero.

Runs compiled on CUDA (values to float32 rounding: the two merges sum in other tile shapes; many
rows and repeated launches, so a missing release/acquire or a stale L1 read would show), else in
Triton's interpreter (bit-identical); skipped without triton.
"""

from __future__ import annotations

import pytest
import torch
from triton_env import DEVICE, HAS_CUDA, load_kernel_modules

(launch, decode_merge, paged) = load_kernel_modules(
    "engine.model.kernels.launch",
    "engine.model.kernels.decode_merge",
    "engine.model.kernels.paged_attention",
)
# paged_attention bound decode_merge's kernels at its import: reload it after them.
(paged,) = load_kernel_modules("engine.model.kernels.paged_attention")


def assert_same(ours: torch.Tensor, ref: torch.Tensor) -> None:
    if HAS_CUDA:
        tol = 1e-5 if ours.dtype == torch.float32 else 8e-3
        torch.testing.assert_close(ours.float(), ref.float(), rtol=tol, atol=tol)
    else:
        assert torch.equal(ours, ref)


def random_batch(gen: torch.Generator, context_lens: list[int], num_heads: int,
                 num_kv_heads: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """q, caches and shuffled disjoint block tables for rows of ``context_lens`` (0: padding)."""
    block_size, head_dim = 4, 32
    width = -(-max(context_lens) // block_size)
    rows = len(context_lens)
    tables = torch.randperm(rows * width, generator=gen).to(torch.int32).reshape(rows, width)
    shape = (rows * width, block_size, num_kv_heads, head_dim)
    q = torch.randn(rows, num_heads, head_dim, generator=gen).to(dtype)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    ctx = torch.tensor(context_lens, dtype=torch.int32)
    return tuple(t.to(DEVICE) for t in (q, k_cache, v_cache, tables, ctx))


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 2), (4, 4), (8, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [2, 4, 16])
@pytest.mark.parametrize("ordered", [False, True])
def test_the_last_split_merges_as_the_merge_kernel_does(
    num_heads: int, num_kv_heads: int, dtype: torch.dtype, splits: int, ordered: bool
) -> None:
    gen = torch.Generator().manual_seed(num_heads * 10 + num_kv_heads + splits)
    # Splits with nothing to read (1 token, 16 splits), a padding row, a long row.
    lens = [300, 1, 0, 65, 9, 128] if HAS_CUDA else [70, 1, 0, 9]
    q, k_cache, v_cache, tables, ctx = random_batch(gen, lens, num_heads, num_kv_heads, dtype)
    order = torch.argsort(ctx, descending=True).to(torch.int32) if ordered else None
    ref = paged.paged_decode_attention(
        q, k_cache, v_cache, tables, ctx, 0.2, num_splits=splits, order=order, inline_merge=False
    )
    ours = paged.paged_decode_attention(
        q, k_cache, v_cache, tables, ctx, 0.2, num_splits=splits, order=order, inline_merge=True
    )
    assert_same(ours, ref)
    assert not ours[2].any()  # the padding row
    counters = decode_merge.arrival_counters(torch.device(DEVICE), 1)
    assert counters is not None and not counters.any()  # every launch leaves them at zero


@pytest.mark.skipif(not HAS_CUDA, reason="many programs at once: the ordering only a GPU tests")
def test_repeated_launches_of_many_rows_merge_alike() -> None:
    gen = torch.Generator().manual_seed(7)
    lens = torch.randint(1, 2000, (64,), generator=gen).tolist()
    q, k_cache, v_cache, tables, ctx = random_batch(gen, lens, 16, 8, torch.bfloat16)
    ref = paged.paged_decode_attention(
        q, k_cache, v_cache, tables, ctx, 0.1, num_splits=16, inline_merge=False
    )
    for _ in range(50):
        ours = paged.paged_decode_attention(
            q, k_cache, v_cache, tables, ctx, 0.1, num_splits=16, inline_merge=True
        )
        assert_same(ours, ref)


def test_the_process_setting_decides_when_the_call_does_not() -> None:
    gen = torch.Generator().manual_seed(3)
    q, k_cache, v_cache, tables, ctx = random_batch(gen, [9, 5], 4, 2, torch.float32)
    before = launch.decode_inline_merge()
    calls: list[int] = []
    original = paged.decode_merge_kernel
    try:
        paged.decode_merge_kernel = type(  # counts the merge kernel's launches
            "Counting", (), {"__getitem__": lambda self, grid: lambda *a, **k: calls.append(1)}
        )()
        for setting in (True, False):
            launch.set_decode_inline_merge(setting)
            paged.paged_decode_attention(q, k_cache, v_cache, tables, ctx, 1.0, num_splits=2)
    finally:
        paged.decode_merge_kernel = original
        launch.set_decode_inline_merge(before)
    assert calls == [1]  # only the call made with the setting off launched the merge kernel


def test_counters_are_kept_per_device_and_grow() -> None:
    device = torch.device(DEVICE)
    small = decode_merge.arrival_counters(device, 8)
    assert small is not None and small.numel() >= 8
    assert decode_merge.arrival_counters(device, 8) is small
    big = decode_merge.arrival_counters(device, small.numel() + 1)
    assert big is not None and big.numel() > small.numel() and not big.any()
