"""Fused elementwise kernels and the GPU sampler against the PyTorch layers they replace.

Runs compiled on CUDA, else in Triton's interpreter (tiny shapes); skipped without triton.
"""

from __future__ import annotations

import math

import pytest
import torch
from triton_env import DEVICE, HAS_CUDA, load_kernel_modules

(fused, sampler) = load_kernel_modules("engine.model.kernels.fused", "engine.model.kernels.sampler")

from engine.model.layers.activation import SiluAndMul  # noqa: E402
from engine.model.layers.layernorm import RMSNorm  # noqa: E402
from engine.model.layers.rotary_embedding import RotaryEmbedding  # noqa: E402

FP32_TOL = 1e-5
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(out).any()
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def norm_module(hidden: int, gen: torch.Generator, dtype: torch.dtype) -> RMSNorm:
    norm = RMSNorm(hidden, eps=1e-6)
    norm.weight.data = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    return norm


@pytest.mark.parametrize("hidden", [64, 48])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_module(hidden: int, with_residual: bool) -> None:
    gen = torch.Generator().manual_seed(hidden + with_residual)
    norm = norm_module(hidden, gen, torch.float32)
    x = torch.randn(5, hidden, generator=gen) * 3
    res = torch.randn(5, hidden, generator=gen)
    w = norm.weight.data.to(DEVICE)
    if with_residual:
        out, new_res = fused.rms_norm(x.to(DEVICE), w, norm.eps, res.to(DEVICE))
        ref, ref_res = norm(x, res)
        assert torch.allclose(new_res.cpu(), ref_res)
    else:
        out = fused.rms_norm(x.to(DEVICE), w, norm.eps)
        ref = norm(x)
    assert rel_err(out.cpu(), ref) < FP32_TOL


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 2), (2, 2)])
def test_qk_norm_rope_matches_modules(num_heads: int, num_kv_heads: int) -> None:
    head_dim, tokens = 16, 7
    gen = torch.Generator().manual_seed(num_heads)
    q_norm = norm_module(head_dim, gen, torch.float32)
    k_norm = norm_module(head_dim, gen, torch.float32)
    rope = RotaryEmbedding(head_dim, head_dim, 64, 10000.0)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(tokens, width, generator=gen)
    positions = torch.randint(0, 64, (tokens,), generator=gen)
    q, k, v = fused.qk_norm_rope(
        qkv.to(DEVICE),
        q_norm.weight.data.to(DEVICE),
        k_norm.weight.data.to(DEVICE),
        rope.cos_cache.to(DEVICE),
        rope.sin_cache.to(DEVICE),
        positions.to(DEVICE),
        num_heads,
        num_kv_heads,
        head_dim,
        q_norm.eps,
    )
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    rq, rk, rv = qkv.split([q_size, kv_size, kv_size], dim=-1)
    rq = q_norm(rq.reshape(tokens, num_heads, head_dim))
    rk = k_norm(rk.reshape(tokens, num_kv_heads, head_dim))
    rq, rk = rope(positions, rq, rk)
    assert rel_err(q.cpu(), rq) < FP32_TOL
    assert rel_err(k.cpu(), rk) < FP32_TOL
    assert torch.equal(v.cpu(), rv.reshape(tokens, num_kv_heads, head_dim))


def test_silu_and_mul_matches_module() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 2 * 40, generator=gen)
    out = fused.silu_and_mul(x.to(DEVICE))
    assert out.shape == (3, 2, 40)
    assert rel_err(out.cpu(), SiluAndMul()(x)) < FP32_TOL


def test_sampler_greedy_rows_take_the_argmax() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 70, generator=gen)
    temps = torch.zeros(6)
    tokens = sampler.sample_tokens(logits.to(DEVICE), temps.to(DEVICE), seed=1, block_v=16)
    assert torch.equal(tokens.cpu(), logits.argmax(-1))


def test_sampler_is_seeded() -> None:
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(12, 9, generator=gen).to(DEVICE)
    temps = torch.full((12,), 1.0, device=DEVICE)
    tokens = sampler.sample_tokens(logits, temps, seed=123)
    assert torch.equal(tokens, sampler.sample_tokens(logits, temps, seed=123))
    assert not torch.equal(tokens, sampler.sample_tokens(logits, temps, seed=124))


def test_sampler_draws_from_softmax() -> None:
    """Many rows of the same logits: token frequencies match softmax(logits / T)."""
    # Small: the interpreter draws noise slowly (~20 ms per row).
    vocab, rows, temp = 6, 600, 0.7
    gen = torch.Generator().manual_seed(6)
    row = torch.randn(vocab, generator=gen)
    logits = row.expand(rows, vocab).contiguous().to(DEVICE)
    temps = torch.full((rows,), temp, device=DEVICE)
    tokens = sampler.sample_tokens(logits, temps, seed=99).cpu()
    counts = torch.bincount(tokens, minlength=vocab).double()
    expected = torch.softmax(row.double() / temp, -1) * rows
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 5 degrees of freedom: P(chi2 > 25) is about 1e-4.
    assert chi2 < 25, f"chi-square {chi2:.1f}"
    assert math.isclose(float(counts.sum()), rows)


@needs_cuda
@pytest.mark.gpu
def test_fused_bf16_qwen3_shapes() -> None:
    gen = torch.Generator().manual_seed(9)
    hidden = 1024
    norm = norm_module(hidden, gen, torch.bfloat16)
    x = torch.randn(300, hidden, generator=gen).bfloat16()
    res = torch.randn(300, hidden, generator=gen).bfloat16()
    out, new_res = fused.rms_norm(x.cuda(), norm.weight.data.cuda(), 1e-6, res.cuda())
    ref, ref_res = norm.cuda()(x.cuda(), res.cuda())
    assert torch.equal(new_res, ref_res)
    assert rel_err(out, ref) < 1e-2
    logits = torch.randn(256, 151936, generator=gen).bfloat16().cuda()
    tokens = sampler.sample_tokens(logits, torch.zeros(256, device="cuda"), seed=0)
    assert torch.equal(tokens, logits.float().argmax(-1))
