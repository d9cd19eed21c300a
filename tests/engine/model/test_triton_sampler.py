"""The engine's GPU sampler (engine/model/kernels/sampler.py): Gumbel-max, exact and seeded.

Runs compiled on CUDA, else in Triton's interpreter (tiny shapes); skipped without triton. The
kernel is checked in two steps that together give the distribution: (1) its token is exactly
``argmax(logits * log2(e) / T + noise)`` for the noise it draws (exposed by ``sampler_noise``),
and (2) that noise is base-2 Gumbel (Kolmogorov-Smirnov) and its argmax over many rows gives
``softmax(logits / T)`` frequencies (chi-square). The variants it was chosen from are tested in
tests/benchmarks/test_sampler_variants.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from triton_env import DEVICE, HAS_CUDA, load_kernel_modules

(sampler,) = load_kernel_modules("engine.model.kernels.sampler")

LOG2E = 1.4426950408889634


def expected_tokens(logits: torch.Tensor, temps: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Gumbel-max in float32 as the kernel computes it; greedy rows draw no noise."""
    sampled = temps > 0
    scale = torch.where(sampled, torch.tensor(LOG2E) / torch.where(sampled, temps, 1.0), 1.0)
    scores = logits.float() * scale[:, None]
    scores = torch.where(sampled[:, None], scores + noise, scores)
    return scores.argmax(-1)  # the first maximum: lowest column on ties


@pytest.mark.parametrize("splits", [2, 1])  # 2: finished by the second kernel; 1: direct
def test_tokens_are_the_gumbel_max_of_its_noise(splits: int) -> None:
    gen = torch.Generator().manual_seed(splits)
    rows, vocab, block_v = 3, 120, 32  # 4 tiles: 2 splits of 2 tiles, or 1 split of 4
    # Small integers: many exact ties, which greedy rows must break toward the lowest column.
    logits = torch.randint(-3, 4, (rows, vocab), generator=gen).float()
    logits[2, 10], logits[2, 40], logits[2, 70] = 40.0, 39.0, 38.0
    temps = torch.tensor([0.0, 0.6, 1.7])
    tokens = sampler.sample_tokens(
        logits.to(DEVICE), temps.to(DEVICE), 11, block_v, splits=splits
    ).cpu()
    assert tokens.dtype == torch.int64
    if HAS_CUDA:  # compiled: FMA contraction may move a score by an ulp; check greedy rows only
        assert tokens[0] == logits[0].argmax()
    else:
        noise = sampler.sampler_noise(rows, vocab, 11, block_v, DEVICE).cpu()
        assert torch.equal(tokens, expected_tokens(logits, temps, noise))


def test_sampler_is_deterministic_per_seed() -> None:
    logits = torch.randn(3, 32, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    temps = torch.full((3,), 2.0, device=DEVICE)
    draws = [sampler.sample_tokens(logits, temps, s, 32) for s in (5, 5, 6)]
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], draws[2])


def test_greedy_rows_take_the_first_argmax() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-2, 3, (3, 80), generator=gen).float()
    logits[1, 70] = 9.0  # a lone maximum in the last, partial tile
    temps = torch.zeros(3)
    tokens = sampler.sample_tokens(logits.to(DEVICE), temps.to(DEVICE), 1, 32)
    assert torch.equal(tokens.cpu(), logits.argmax(-1))


def test_noise_is_gumbel_and_its_argmax_draws_from_softmax() -> None:
    rows, vocab, temp = 2048, 32, 0.6  # vocab = block_v: all four Philox words are used
    noise = sampler.sampler_noise(rows, vocab, 7, 32, DEVICE).cpu()
    assert torch.isfinite(noise).all()
    # P(G <= g) = exp(-ln2 * 2**-g) for G = -log2(-log2 U): Kolmogorov-Smirnov.
    values = noise.double().flatten().sort().values
    cdf = torch.exp(-math.log(2) * torch.exp2(-values))
    n = values.numel()
    ranks = torch.arange(1, n + 1, dtype=torch.float64) / n
    ks = float(torch.maximum(ranks - cdf, cdf - (ranks - 1 / n)).max())
    assert ks < 1.95 / math.sqrt(n), f"KS {ks:.4f} (p < 0.001)"
    # Neighbouring rows and columns are uncorrelated.
    centered = noise.double() - noise.double().mean()
    for a, b in ((centered[:-1], centered[1:]), (centered[:, :-1], centered[:, 1:])):
        corr = float((a * b).mean() / (a.std() * b.std()))
        assert abs(corr) < 4 / math.sqrt(a.numel()), f"correlation {corr:.4f}"
    # Many rows of the same logits: token frequencies match softmax(logits / T).
    row = 0.5 * torch.randn(vocab, generator=torch.Generator().manual_seed(6))
    tokens = expected_tokens(row.expand(rows, vocab), torch.full((rows,), temp), noise)
    counts = torch.bincount(tokens, minlength=vocab).double()
    expected = torch.softmax(row.double() / temp, -1) * rows
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 65, f"chi-square {chi2:.1f} (31 degrees of freedom: P(> 65) ~ 3e-4)"
    # Seeded: the same seed gives the same noise, another seed other noise.
    assert torch.equal(noise, sampler.sampler_noise(rows, vocab, 7, 32, DEVICE).cpu())
    other = sampler.sampler_noise(rows, vocab, 8, 32, DEVICE).cpu()
    assert (noise != other).float().mean() > 0.99


def test_extreme_logits_give_valid_ids() -> None:
    vocab = 64
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(4))
    logits[0] = float("-inf")
    logits[0, 50] = -1e30  # the only finite logit wins whatever the noise
    logits[1] = float("-inf")  # nothing finite: any valid id
    logits[2, 17] = 3e38  # overflows to +inf once scaled: that column
    logits[3, 40:] = float("inf")  # +inf ties: the first
    logits[4] = -3e38
    temps = torch.tensor([0.6, 0.6, 0.6, 1.0, 0.01])
    with np_errstate_ignored():
        tokens = sampler.sample_tokens(logits.to(DEVICE), temps.to(DEVICE), 3, 32)
    tokens = tokens.cpu()
    assert ((tokens >= 0) & (tokens < vocab)).all(), tokens
    assert tokens[0] == 50 and tokens[2] == 17 and tokens[3] == 40


def np_errstate_ignored():  # the interpreter computes with numpy: inf * x warns there
    import numpy as np

    return np.errstate(over="ignore", invalid="ignore")


def test_split_plan_covers_the_vocab() -> None:
    for rows in (1, 3, 64, 256, 1000):
        for block_v in (64, 4096):
            splits, span = sampler.split_plan(rows, 151936, block_v, 1024)
            assert span % block_v == 0
            assert (splits - 1) * span < 151936 <= splits * span
    assert sampler.split_plan(256, 151936, 4096, 1024, splits=1) == (1, 38 * 4096)


def test_negative_seeds_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        sampler.seed_halves(-1)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_qwen3_vocab_bf16() -> None:
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(64, 151936, generator=gen).bfloat16().cuda()
    tokens = sampler.sample_tokens(logits, torch.zeros(64, device="cuda"), 0)
    assert torch.equal(tokens, logits.float().argmax(-1))
    temps = torch.full((64,), 0.6, device="cuda")
    sampled = sampler.sample_tokens(logits, temps, 5)
    assert ((sampled >= 0) & (sampled < 151936)).all()
    assert torch.equal(sampled, sampler.sample_tokens(logits, temps, 5))


def test_warm_up_samples_one_row_in_both_variants() -> None:
    """``warm_up_sampler`` runs the one-split and the finished variants on one row of zeros."""
    sampler.warm_up_sampler(120, DEVICE)
    logits = torch.zeros(1, 120, device=DEVICE)
    for splits in (1, 2):
        token = sampler.sample_tokens(logits, torch.zeros(1, device=DEVICE), 0, 32,
                                      splits=splits)
        assert token.tolist() == [0]  # greedy over ties: the lowest column


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_no_batch_size_compiles_a_kernel_after_the_warm_up() -> None:
    """After ``warm_up_sampler`` (the engine's start-up), sampling 1..300 rows of the Qwen3
    vocabulary compiles nothing: a compile on the engine thread stalled a step ~75 ms the first
    time each batch size came up (docs/gpu-notes.md, session 18)."""
    vocab = 151936
    sampler.warm_up_sampler(vocab, "cuda")

    def compiled() -> int:
        return sum(len(kernel.device_caches[torch.cuda.current_device()][0])
                   for kernel in (sampler._sample_kernel, sampler._finish_kernel))

    before = compiled()
    logits = torch.randn(300, vocab, device="cuda").bfloat16()
    for rows in (1, 2, 3, 7, 16, 17, 64, 100, 127, 128, 254, 256, 300):
        sampler.sample_tokens(logits[:rows].contiguous(), torch.ones(rows, device="cuda"), rows)
    assert compiled() == before
