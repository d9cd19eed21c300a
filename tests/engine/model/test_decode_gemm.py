"""The split-K decode GEMM's plumbing on the CPU: which batches and shapes take it, and that the
model's MLP, row-parallel projections and RMSNorm hand partials along correctly.

The kernel itself (``engine/model/kernels/skinny_gemm.py``) is checked against PyTorch in
``test_triton_skinny_gemm.py``; here a PyTorch stand-in with the same contract plays it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from engine.model.layers.cuda_kernels import FusedKernels
from engine.model.layers.decode_gemm import (
    COLUMN_ROLES,
    DECODE_TILINGS,
    PREFETCH_ROWS,
    PREFETCH_TILINGS,
    DecodeGemm,
    SplitKParts,
    SplitKTiling,
    split_k_batches,
)
from engine.model.layers.layernorm import RMSNorm
from engine.model.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from engine.model.layers.parallel import ParallelGroup
from engine.model.qwen3 import Qwen3MLP, Qwen3Spec

# Qwen3-0.6B's (K, N) of the projections the tilings were chosen for.
SHAPES = {
    "o_proj": (2048, 1024),
    "down": (3072, 1024),
    "qkv": (1024, 4096),
    "gate_up": (1024, 6144),
}


def reference_split_k(
    x: torch.Tensor, weight: torch.Tensor, tiling: SplitKTiling, silu_mul: bool = False
) -> torch.Tensor:
    """What ``skinny_gemm.splitk_linear`` returns, in PyTorch: float32 partials over K slices,
    or with one split the product in ``x``'s dtype."""
    if silu_mul:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    if tiling.split_k == 1:
        return (x.float() @ weight.float().T).to(x.dtype)
    slices = zip(x.float().chunk(tiling.split_k, -1), weight.float().chunk(tiling.split_k, -1))
    return torch.stack([a @ w.T for a, w in slices])


KERNEL = SimpleNamespace(splitk_linear=reference_split_k)


def test_every_tiling_fits_its_projection_and_splits() -> None:
    """Each bucket's tiling covers the shapes it was chosen for and writes partials (split >= 2:
    the consumer is the partial-summing norm); buckets are in increasing batch order."""
    for role, buckets in DECODE_TILINGS.items():
        k, n = SHAPES[role]
        bounds = [rows for rows, _ in buckets]
        assert bounds == sorted(bounds)
        for rows, tiling in buckets:
            assert tiling.split_k >= 2
            assert tiling.fits(rows, n, k)
    assert split_k_batches() == sorted({r for b in DECODE_TILINGS.values() for r, _ in b})


def test_tiling_choice_by_batch_and_shape() -> None:
    """A batch takes the first bucket that holds it; past the last, or on a shape the tiling
    does not divide, cuBLAS serves (None)."""
    gemm = DecodeGemm(KERNEL, "o_proj")
    k, n = SHAPES["o_proj"]
    buckets = DECODE_TILINGS["o_proj"]
    assert gemm.tiling(1, n, k) == buckets[0][1]
    assert gemm.tiling(buckets[0][0] + 1, n, k) == buckets[1][1]
    assert gemm.tiling(buckets[-1][0] + 1, n, k) is None
    assert gemm.tiling(1, n + 8, k) is None
    with pytest.raises(ValueError, match="no decode tilings"):
        DecodeGemm(KERNEL, "qkv")


def test_float32_keeps_cublas_and_half_precision_gets_partials() -> None:
    gemm = DecodeGemm(KERNEL, "down")
    k, n = SHAPES["down"]
    weight = torch.randn(n, k, dtype=torch.bfloat16)
    assert gemm.project(torch.randn(4, k), weight.float()) is None
    out = gemm.project(torch.randn(4, 2 * k, dtype=torch.bfloat16), weight, silu_mul=True)
    assert isinstance(out, SplitKParts)
    assert out.parts.shape == (DECODE_TILINGS["down"][0][1].split_k, 4, n)


def test_row_parallel_projection_takes_split_k_only_alone_and_without_bias() -> None:
    """The partials are summed by the next norm, never all-reduced nor biased: a rank of a TP
    group, or a projection with a bias, keeps its forward."""
    gemm = DecodeGemm(KERNEL, "o_proj")
    plain = RowParallelLinear(2048, 1024, bias=False)
    plain.use_split_k(gemm)
    assert plain.split_k(torch.randn(3, 2048, dtype=torch.bfloat16)) is not None
    biased = RowParallelLinear(2048, 1024, bias=True)
    biased.use_split_k(gemm)
    sharded = RowParallelLinear(2048, 1024, group=ParallelGroup(rank=0, world_size=2))
    sharded.use_split_k(gemm)
    for layer in (biased, sharded, RowParallelLinear(2048, 1024)):
        assert layer.split_k(torch.randn(3, layer.input_size, dtype=torch.bfloat16)) is None


def test_the_runner_reports_split_k_where_a_projection_took_it_in_half_precision() -> None:
    """``runs_split_k`` (the runner's ``split_k_gemm`` description) follows what the layers
    took and the dtype the kernel serves, not a restatement of their rule."""
    from torch import nn

    from engine.model.layers.linear import runs_split_k

    alone = RowParallelLinear(2048, 1024, bias=False)
    sharded = RowParallelLinear(2048, 1024, group=ParallelGroup(rank=0, world_size=2))
    model = nn.ModuleList([alone, sharded])
    assert not runs_split_k(model, torch.bfloat16)  # neither took a DecodeGemm yet
    sharded.use_split_k(DecodeGemm(KERNEL, "o_proj"))
    assert not runs_split_k(model, torch.bfloat16)  # a TP rank refuses it
    alone.use_split_k(DecodeGemm(KERNEL, "o_proj"))
    assert runs_split_k(model, torch.bfloat16) and runs_split_k(model, torch.float16)
    assert not runs_split_k(model, torch.float32)  # float32 keeps cuBLAS


def test_norm_sums_partials_through_the_fused_kernel_only() -> None:
    parts = SplitKParts(torch.randn(2, 3, 8))
    residual = torch.randn(3, 8)
    with pytest.raises(ValueError, match="fused norm and a residual"):
        RMSNorm(8)(parts, residual)
    seen = {}

    def rms_norm_of_parts(p: torch.Tensor, w: torch.Tensor, eps: float, r: torch.Tensor) -> tuple:
        seen["args"] = (p, r)
        return p.sum(0), r

    norm = RMSNorm(8, fused=SimpleNamespace(rms_norm_of_parts=rms_norm_of_parts))
    norm(parts, residual)
    assert seen["args"][0] is parts.parts and seen["args"][1] is residual
    with pytest.raises(ValueError):
        norm(parts)


def test_mlp_hands_down_the_gate_up_rows_for_swiglu_inside_the_gemm() -> None:
    """The MLP's split-K output sums to what its cuBLAS path computes: ``down`` receives the
    ``[gate | up]`` rows and applies SwiGLU itself (the separate activation is skipped)."""
    spec = Qwen3Spec(
        vocab_size=32, hidden_size=1024, intermediate_size=3072, num_hidden_layers=1,
        num_attention_heads=8, num_key_value_heads=4, head_dim=128,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cpu"):
        mlp = Qwen3MLP(spec, ParallelGroup(), FusedKernels(split_k=KERNEL)).to(torch.bfloat16)
    for p in mlp.parameters():
        p.data.normal_(0, 0.02)
    x = torch.randn(5, 1024, dtype=torch.bfloat16)
    out = mlp(x)
    assert isinstance(out, SplitKParts)
    gate, up = F.linear(x, mlp.gate_up_proj.weight).chunk(2, -1)
    ref = F.linear((F.silu(gate) * up).float(), mlp.down_proj.weight.float())
    assert torch.allclose(out.parts.sum(0), ref, rtol=1e-3, atol=1e-3)
    big = torch.randn(DECODE_TILINGS["down"][-1][0] + 1, 1024, dtype=torch.bfloat16)
    assert isinstance(mlp(big), torch.Tensor)  # past the last bucket: cuBLAS


def test_prefetch_table_prefetches_and_column_roles_take_one_split() -> None:
    """``PREFETCH_TILINGS`` (``Config.decode_gemm_prefetch``): every projection has a tiling
    up to ``PREFETCH_ROWS`` rows and those prefetch their weights; past it the split-K table's
    tilings; each fits the shape it serves; qkv and gate_up, whose output feeds no norm, take
    one split; buckets in increasing batch order."""
    assert set(PREFETCH_TILINGS) == set(SHAPES)
    for role, buckets in PREFETCH_TILINGS.items():
        k, n = SHAPES[role]
        assert [rows for rows, _ in buckets] == sorted(rows for rows, _ in buckets)
        assert buckets[0][0] == PREFETCH_ROWS
        for rows, tiling in buckets:
            assert tiling.prefetch == (rows <= PREFETCH_ROWS) and tiling.fits(rows, n, k)
            assert tiling.prefetch or (rows, tiling) in DECODE_TILINGS[role]
            assert role not in COLUMN_ROLES or tiling.split_k == 1


ONE_SPLIT = {
    "qkv": ((32, SplitKTiling(64, 16, 64, 1, 4, 4, prefetch=True)),),
    "gate_up": ((32, SplitKTiling(64, 32, 128, 1, 4, 3, prefetch=True)),),
    "down": ((32, SplitKTiling(64, 32, 128, 1, 4, 3, prefetch=True)),),
}


def test_column_projections_run_one_split_tilings_up_to_their_last_bucket() -> None:
    """A column projection that took a :class:`DecodeGemm` returns the kernel's one-split
    output for a batch its table serves and ``F.linear``'s beyond; a biased one keeps
    ``F.linear``."""
    torch.manual_seed(1)
    qkv = QKVParallelLinear(1024, 128, 16, 8, bias=False).to(torch.bfloat16)
    gate_up = MergedColumnParallelLinear(1024, [3072, 3072], bias=False).to(torch.bfloat16)
    calls = []

    def kernel(x: torch.Tensor, w: torch.Tensor, tiling: SplitKTiling, silu_mul: bool = False):
        calls.append(tiling)
        return reference_split_k(x, w, tiling, silu_mul)

    stand_in = SimpleNamespace(splitk_linear=kernel)
    for layer, role in ((qkv, "qkv"), (gate_up, "gate_up")):
        layer.weight.data.normal_(0, 0.02)
        layer.use_decode_gemm(DecodeGemm(stand_in, role, ONE_SPLIT))
        x = torch.randn(5, 1024, dtype=torch.bfloat16)
        out = layer(x)
        assert calls.pop() == ONE_SPLIT[role][0][1] and out.dtype == torch.bfloat16
        assert torch.allclose(out.float(), F.linear(x, layer.weight).float(), atol=1e-2)
        assert layer(torch.randn(33, 1024, dtype=torch.bfloat16)).shape[0] == 33 and not calls
    biased = QKVParallelLinear(1024, 128, 16, 8, bias=True)
    biased.use_decode_gemm(DecodeGemm(stand_in, "qkv", ONE_SPLIT))
    assert biased.decode_gemm is None


def test_a_one_split_row_projection_hands_a_tensor_to_the_norm() -> None:
    """With a one-split tiling ``down`` returns its output as a plain tensor (no partials to
    sum), SwiGLU still computed inside the GEMM."""
    spec = Qwen3Spec(
        vocab_size=32, hidden_size=1024, intermediate_size=3072, num_hidden_layers=1,
        num_attention_heads=8, num_key_value_heads=4, head_dim=128,
    )  # fmt: skip
    torch.manual_seed(2)
    kernels = FusedKernels(split_k=KERNEL, decode_tilings=ONE_SPLIT)
    with torch.device("cpu"):
        mlp = Qwen3MLP(spec, ParallelGroup(), kernels).to(torch.bfloat16)
    for p in mlp.parameters():
        p.data.normal_(0, 0.02)
    assert mlp.gate_up_proj.decode_gemm is not None
    x = torch.randn(5, 1024, dtype=torch.bfloat16)
    out = mlp(x)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    gate, up = F.linear(x, mlp.gate_up_proj.weight).chunk(2, -1)
    ref = F.linear((F.silu(gate) * up).float(), mlp.down_proj.weight.float())
    assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-3)
