"""The sampler's variants (benchmarks/sampler_variants.py): Gumbel-max, exact and seeded, and
the engine's kernel (engine/model/kernels/sampler.py) drawing the tokens of its variant.

Runs compiled on CUDA, else in Triton's interpreter (tiny shapes); skipped without triton. The
tiles variants are checked in two steps that together give the distribution: (1) the kernel's
token is exactly ``argmax(logits * log2(e) / T + noise)`` for the noise the variant draws
(exposed by ``tiles_noise``), and (2) that noise is base-2 Gumbel (Kolmogorov-Smirnov) and its
argmax over many rows gives ``softmax(logits / T)`` frequencies (chi-square).
"""

from __future__ import annotations

import math

import pytest
import torch
from triton_env import DEVICE, HAS_CUDA, load_kernel_modules

# Reloaded in import order: each module picks up the reloaded kernels it imports by name.
(engine_sampler, _, sampler) = load_kernel_modules(
    "engine.model.kernels.sampler",
    "benchmarks.sampler_variant_kernels",
    "benchmarks.sampler_variants",
)

LOG2E = 1.4426950408889634
# Tiles variants whose sampling code differs (noise functions differ only inside _tile_noise,
# which the noise tests cover for every kind; block width, warps and the split policy are
# overridden by the tests, so other variants run the same code as tiles-p7 here).
TILES_SAMPLERS = [
    "tiles-p7",
    "tiles-hash1",
    "tiles-p7-torchfin",
    "tiles-p7-prune",
    "tiles-p7-rowloop",
    "tiles-p7-atomic",
]
# One variant per distinct noise function (block width, warps, splits and finish do not change it).
NOISES = ["tiles-p10", "tiles-p7", "tiles-hash1", "tiles-hash2"]  # (tail: see the probe test)


def expected_tokens(logits: torch.Tensor, temps: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Gumbel-max in float32 as the kernel computes it; greedy rows draw no noise."""
    sampled = temps > 0
    scale = torch.where(sampled, torch.tensor(LOG2E) / torch.where(sampled, temps, 1.0), 1.0)
    scores = logits.float() * scale[:, None]
    scores = torch.where(sampled[:, None], scores + noise, scores)
    return scores.argmax(-1)  # the first maximum: lowest column on ties


@pytest.mark.parametrize("name", TILES_SAMPLERS)
def test_tiles_variant_is_gumbel_max_of_its_noise(name: str) -> None:
    gen = torch.Generator().manual_seed(len(name))
    rows, vocab, block_v = 3, 120, 32  # 4 tiles: 2 splits of 2 tiles (rowloop: 1 split)
    # Small integers: many exact ties, which greedy rows must break toward the lowest column.
    logits = torch.randint(-3, 4, (rows, vocab), generator=gen).float()
    # Row 2: the first tile of each split holds a large logit; split 0's second tile holds a
    # close one (its noise is needed), the other tiles cannot win (prune skips their noise).
    logits[2, 10], logits[2, 40], logits[2, 70] = 40.0, 39.0, 38.0
    temps = torch.tensor([0.0, 0.6, 1.7])
    splits = None if sampler.SAMPLER_VARIANTS[name].splits else 2
    tokens = sampler.sample_tokens(
        logits.to(DEVICE), temps.to(DEVICE), 11, block_v, variant=name, splits=splits
    ).cpu()
    assert tokens.dtype == torch.int64
    if HAS_CUDA:  # compiled: FMA contraction may move a score by an ulp; check greedy rows only
        assert tokens[0] == logits[0].argmax()
    else:
        noise = sampler.tiles_noise(rows, vocab, 11, name, block_v, DEVICE).cpu()
        assert torch.equal(tokens, expected_tokens(logits, temps, noise))


@pytest.mark.parametrize("name", ["ref", "tiles-p7"])
def test_sampler_is_deterministic_per_seed(name: str) -> None:
    logits = torch.randn(3, 32, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    temps = torch.full((3,), 2.0, device=DEVICE)
    draws = [sampler.sample_tokens(logits, temps, s, 32, variant=name) for s in (5, 5, 6)]
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], draws[2])


@pytest.mark.parametrize("name", ["ref", "chunk-p7", "chunk-floor", "tiles-floor", "tiles-p7"])
def test_greedy_rows_take_the_first_argmax(name: str) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-2, 3, (3, 80), generator=gen).float()
    logits[1, 70] = 9.0  # a lone maximum in the last, partial tile
    temps = torch.zeros(3)
    tokens = sampler.sample_tokens(logits.to(DEVICE), temps.to(DEVICE), 1, 32, variant=name)
    assert torch.equal(tokens.cpu(), logits.argmax(-1))


@pytest.mark.parametrize("name", NOISES)
def test_noise_is_gumbel_and_its_argmax_draws_from_softmax(name: str) -> None:
    rows, vocab, temp = 2048, 32, 0.6  # vocab = block_v: all four Philox words are used
    noise = sampler.tiles_noise(rows, vocab, 7, name, 32, DEVICE).cpu()
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
    assert torch.equal(noise, sampler.tiles_noise(rows, vocab, 7, name, 32, DEVICE).cpu())
    other = sampler.tiles_noise(rows, vocab, 8, name, 32, DEVICE).cpu()
    assert (noise != other).float().mean() > 0.99


@pytest.mark.parametrize("name", ["ref", "tiles-p7-atomic"])
def test_extreme_logits_give_valid_ids(name: str) -> None:
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
        tokens = sampler.sample_tokens(logits.to(DEVICE), temps.to(DEVICE), 3, 32, variant=name)
    tokens = tokens.cpu()
    assert ((tokens >= 0) & (tokens < vocab)).all(), tokens
    assert tokens[0] == 50 and tokens[2] == 17 and tokens[3] == 40


def np_errstate_ignored():  # the interpreter computes with numpy: inf * x warns there
    import numpy as np

    return np.errstate(over="ignore", invalid="ignore")


def test_gumbel_transform_is_accurate_near_one() -> None:
    """The tail series keeps -log2(-log2 u) accurate for u up to 1 - 2**-24."""
    k = torch.arange(0, 2**12, dtype=torch.float64)
    near_one = 1 - (2 * k + 1) * 2.0**-24  # the largest uniforms the tiles kernels draw
    u = torch.cat([near_one, torch.linspace(2.0**-24, 1 - 2.0**-10, 512, dtype=torch.float64)])
    exact = -torch.log2(-torch.log2(u))
    res = sampler.gumbel_probe(u.float().to(DEVICE), "tiles").cpu()
    err = (res.cpu().double() - exact).abs().max()
    assert err < 1e-4, f"max abs error {err:.2e}"
    assert torch.isfinite(res).all()


def test_split_plan_covers_the_vocab() -> None:
    for rows in (1, 3, 64, 256, 1000):
        for block_v in (64, 4096):
            splits, span = sampler.split_plan(rows, 151936, block_v, 1024)
            assert span % block_v == 0
            assert (splits - 1) * span < 151936 <= splits * span
    assert sampler.split_plan(256, 151936, 4096, 1024, splits=1) == (1, 38 * 4096)


def test_engine_default_is_a_sampler() -> None:
    assert sampler.DEFAULT_SAMPLER_VARIANT == engine_sampler.SAMPLER_VARIANT
    assert sampler.SAMPLER_VARIANTS[sampler.DEFAULT_SAMPLER_VARIANT].is_sampler
    with pytest.raises(ValueError):
        sampler.resolve_variant("no-such-variant")


@pytest.mark.parametrize("splits", [None, 2, 1])
def test_engine_kernel_draws_its_variants_tokens(splits: int | None) -> None:
    """Bit for bit, greedy and sampled rows (compiled: both with the fast log2)."""
    gen = torch.Generator().manual_seed(10)
    rows, vocab, block_v = 5, 200, 32
    logits = torch.randn(rows, vocab, generator=gen).mul(3).to(DEVICE)
    temps = torch.tensor([0.0, 0.6, 1.0, 0.0, 2.0]).to(DEVICE)
    name = engine_sampler.SAMPLER_VARIANT
    for seed in (0, 7, 2**40 + 3):
        ours = engine_sampler.sample_tokens(logits, temps, seed, block_v, splits=splits)
        theirs = sampler.sample_tokens(logits, temps, seed, block_v, variant=name, splits=splits)
        assert torch.equal(ours, theirs)
    noise = engine_sampler.sampler_noise(rows, vocab, 7, block_v, DEVICE)
    assert torch.equal(noise, sampler.tiles_noise(rows, vocab, 7, name, block_v, DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_engine_kernel_draws_its_variants_tokens_qwen3_vocab_bf16() -> None:
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(256, 151936, generator=gen).bfloat16().cuda()
    temps = torch.full((256,), 0.6, device="cuda")
    temps[::3] = 0.0
    name = engine_sampler.SAMPLER_VARIANT
    for rows in (1, 64, 256):
        ours = engine_sampler.sample_tokens(logits[:rows], temps[:rows], 12345)
        theirs = sampler.sample_tokens(logits[:rows], temps[:rows], 12345, variant=name)
        assert torch.equal(ours, theirs)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(sampler.SAMPLER_VARIANTS))
def test_variants_qwen3_vocab_bf16(name: str) -> None:
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(64, 151936, generator=gen).bfloat16().cuda()
    tokens = sampler.sample_tokens(logits, torch.zeros(64, device="cuda"), 0, variant=name)
    assert torch.equal(tokens, logits.float().argmax(-1))
    temps = torch.full((64,), 0.6, device="cuda")
    sampled = sampler.sample_tokens(logits, temps, 5, variant=name)
    assert ((sampled >= 0) & (sampled < 151936)).all()
    assert torch.equal(sampled, sampler.sample_tokens(logits, temps, 5, variant=name))
