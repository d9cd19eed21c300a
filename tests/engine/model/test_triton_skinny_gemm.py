"""The split-K decode GEMM and the RMSNorm that sums its partials, against PyTorch.

Runs compiled on CUDA (bf16, Qwen3-0.6B's shapes), else in Triton's interpreter (tiny float32
shapes); skipped without triton.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_env import DEVICE, HAS_CUDA, load_kernel_modules

(fused, skinny) = load_kernel_modules(
    "engine.model.kernels.fused", "engine.model.kernels.skinny_gemm"
)

from engine.model.layers.decode_gemm import SplitKTiling  # noqa: E402

if HAS_CUDA:
    DTYPE, M, N, K, TOL = torch.bfloat16, 48, 1024, 2048, 1e-2
    TILING = SplitKTiling(64, 16, 128, 4, 4, 3)
else:
    DTYPE, M, N, K, TOL = torch.float32, 5, 32, 64, 1e-5
    TILING = SplitKTiling(16, 16, 16, 2, 4, 1)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def operands(width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, width, generator=gen).to(DTYPE).to(DEVICE)
    w = (torch.randn(N, K, generator=gen) * K**-0.5).to(DTYPE).to(DEVICE)
    return x, w


@pytest.mark.parametrize("split", [1, 2])
def test_splitk_partials_sum_to_the_product(split: int) -> None:
    """One split gives ``x W^T`` in x's dtype; several give float32 partials that sum to it."""
    x, w = operands(K, split)
    tiling = SplitKTiling(**{**vars(TILING), "split_k": split})
    out = skinny.splitk_linear(x, w, tiling)
    ref = F.linear(x.float(), w.float())
    if split == 1:
        assert out.shape == (M, N) and out.dtype == DTYPE
        total = out.float()
    else:
        assert out.shape == (split, M, N) and out.dtype == torch.float32
        total = out.sum(0)
    assert rel_err(total, ref) < TOL


def test_splitk_silu_mul_operand_is_swiglu() -> None:
    """With ``silu_mul`` the input ``[gate | up]`` enters as ``silu_and_mul`` computes it."""
    x, w = operands(2 * K, 7)
    out = skinny.splitk_linear(x, w, TILING, silu_mul=True).sum(0)
    ref = F.linear(fused.silu_and_mul(x).float(), w.float())
    assert rel_err(out, ref) < TOL


def test_rms_norm_of_parts_is_rms_norm_of_the_sum() -> None:
    """Summing partials inside the norm gives what the norm of the rounded sum gives."""
    gen = torch.Generator().manual_seed(3)
    parts = torch.randn(3, M, N, generator=gen).to(DEVICE)
    residual = torch.randn(M, N, generator=gen).to(DTYPE).to(DEVICE)
    weight = (1 + 0.1 * torch.randn(N, generator=gen)).to(DTYPE).to(DEVICE)
    out, new_residual = fused.rms_norm_of_parts(parts, weight, 1e-6, residual)
    summed = (parts[0] + parts[1] + parts[2]).to(DTYPE)
    ref, ref_residual = fused.rms_norm(summed, weight, 1e-6, residual)
    assert torch.equal(new_residual, ref_residual)
    assert torch.equal(out, ref)


def test_splitk_refuses_what_it_cannot_cover() -> None:
    """A tiling that does not divide N or K is refused with a clear error, not a wrong result."""
    x, w = operands(K, 1)
    with pytest.raises(ValueError, match="does not fit"):
        skinny.splitk_linear(x, w[:-1], TILING)
    with pytest.raises(ValueError, match="input width"):
        skinny.splitk_linear(x[:, :-1], w, TILING)


@pytest.mark.skipif(not HAS_CUDA, reason="the L2 prefetch is inline PTX: compiled on CUDA only")
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("split", [1, 4])
def test_prefetching_the_weights_changes_no_result(split: int, pdl: bool) -> None:
    """A tiling that prefetches its weight slice before waiting for the kernel before it
    (``SplitKTiling.prefetch``) computes bit for bit what the plain tiling does, with and
    without programmatic launch."""
    import dataclasses

    from engine.model.kernels.launch import programmatic_launch, set_programmatic_launch

    x, w = operands(2 * K, 13)
    plain = SplitKTiling(**{**vars(TILING), "split_k": split})
    fetched = dataclasses.replace(plain, prefetch=True)
    before = programmatic_launch()
    set_programmatic_launch(pdl, torch.cuda.get_device_capability())
    try:
        for silu_mul in (False, True):
            a = x if silu_mul else x[:, :K].contiguous()
            ref = skinny.splitk_linear(a, w, plain, silu_mul=silu_mul)
            assert torch.equal(skinny.splitk_linear(a, w, fetched, silu_mul=silu_mul), ref)
    finally:
        set_programmatic_launch(before, torch.cuda.get_device_capability())
