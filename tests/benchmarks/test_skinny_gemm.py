"""The split-K sweep only times tilings that cover the product exactly and fill the GPU without
many waves, and covers every batch bucket the model's table uses."""

from __future__ import annotations

import pytest

from benchmarks.gemm import SHAPES
from benchmarks.skinny_gemm import candidate_tilings
from engine.model.layers.decode_gemm import DECODE_TILINGS


@pytest.mark.parametrize("m", [1, 16, 64, 128, 256])
@pytest.mark.parametrize("name,k,n", [s for s in SHAPES if s[0] != "lm_head"])
def test_candidates_fit_and_stay_within_the_program_range(name: str, k: int, n: int, m: int):
    split_ok = name in ("o_proj", "down")
    tilings = candidate_tilings(m, n, k, split_ok)
    for tiling in tilings:
        assert tiling.fits(m, n, k)
        assert tiling.block_m <= max(16, 1 << (m - 1).bit_length())
        programs = (n // tiling.block_n) * -(-m // tiling.block_m) * tiling.split_k
        assert 64 <= programs <= 700
        assert split_ok or tiling.split_k == 1  # an unsplit consumer takes no partials
    if split_ok:
        assert any(t.split_k > 1 for t in tilings)


def test_the_models_tilings_are_among_the_swept_ones() -> None:
    """Every tiling in DECODE_TILINGS is one the sweep can time at its bucket's batch."""
    shapes = {name: (k, n) for name, k, n in SHAPES}
    for role, buckets in DECODE_TILINGS.items():
        k, n = shapes[role]
        for rows, tiling in buckets:
            assert tiling in candidate_tilings(rows, n, k, split_ok=True)
