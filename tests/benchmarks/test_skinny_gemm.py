"""The split-K sweep only times tilings that cover the product exactly and fill the GPU without
many waves, and covers every batch bucket the model's table uses."""

from __future__ import annotations

import pytest

from benchmarks.gemm import SHAPES
from benchmarks.skinny_gemm import MAX_PROGRAMS, MIN_PROGRAMS, candidate_tilings
from engine.model.layers.decode_gemm import DECODE_TILINGS, PREFETCH_TILINGS


@pytest.mark.parametrize("m", [1, 16, 64, 128, 256])
@pytest.mark.parametrize("name,k,n", [s for s in SHAPES if s[0] != "lm_head"])
def test_candidates_fit_and_stay_within_the_program_range(name: str, k: int, n: int, m: int):
    split_ok = name in ("o_proj", "down")
    tilings = candidate_tilings(m, n, k, split_ok)
    for tiling in tilings:
        assert tiling.fits(m, n, k)
        assert tiling.block_m <= max(16, 1 << (m - 1).bit_length())
        programs = (n // tiling.block_n) * -(-m // tiling.block_m) * tiling.split_k
        assert MIN_PROGRAMS <= programs <= MAX_PROGRAMS
        assert split_ok or tiling.split_k == 1  # an unsplit consumer takes no partials
    if split_ok:
        assert any(t.split_k > 1 for t in tilings)


def test_the_models_tilings_are_among_the_swept_ones() -> None:
    """Every tiling in DECODE_TILINGS and PREFETCH_TILINGS is one the sweep can time at its
    bucket's batch (a prefetching one in its prefetching form)."""
    from benchmarks.skinny_gemm import with_prefetch

    shapes = {name: (k, n) for name, k, n in SHAPES}
    for table in (DECODE_TILINGS, PREFETCH_TILINGS):
        for role, buckets in table.items():
            k, n = shapes[role]
            for rows, tiling in buckets:
                swept = candidate_tilings(rows, n, k, split_ok=role in ("o_proj", "down"))
                assert tiling in (with_prefetch(swept) if tiling.prefetch else swept)


def test_prefetching_forms_keep_the_tiling_and_are_named_apart() -> None:
    """``--prefetch`` times the same launch shape with its weights prefetched; the label tells
    the two apart, and a timing row turns back into the tiling it was made with."""
    from benchmarks.skinny_gemm import tiling_of, with_prefetch

    plain = candidate_tilings(64, 1024, 2048, split_ok=True)[:3]
    fetched = with_prefetch(plain)
    for a, b in zip(plain, fetched, strict=True):
        assert (a.block_n, a.block_m, a.block_k, a.split_k) == (
            b.block_n,
            b.block_m,
            b.block_k,
            b.split_k,
        )
        assert not a.prefetch and b.prefetch
        assert b.label() == a.label() + "f"
        assert tiling_of({"us": 1.0, **vars(b)}) == b


def test_best_of_picks_the_fastest_tiling_of_each_shape_by_prefetch() -> None:
    """The layer chain takes, per shape at one batch, the fastest timed tiling of each kind."""
    from benchmarks.skinny_gemm import best_of

    def timed(us: float, prefetch: bool) -> dict:
        return {"us": us, "prefetch": prefetch, "label": f"{us}"}

    rows = [
        {
            "shape": "qkv",
            "M": 64,
            "best_by_kind": {"plain": timed(4.5, False), "prefetch": timed(4.0, True)},
        },
        {"shape": "qkv", "M": 16, "best_by_kind": {"plain": timed(1.0, False)}},
        {"shape": "down", "M": 64, "best_by_kind": {"plain": timed(9.0, False)}},
    ]
    assert best_of(rows, 64, prefetch=False) == {
        "qkv": timed(4.5, False),
        "down": timed(9.0, False),
    }
    assert best_of(rows, 64, prefetch=True) == {"qkv": timed(4.0, True)}


def test_best_by_kind_keeps_the_fastest_row_with_and_without_prefetch() -> None:
    """Each shape's row keeps its fastest plain and fastest prefetching timing apart, so the
    layer chain has both even where one kind never makes the overall top five."""
    from benchmarks.skinny_gemm import best_by_kind

    rows = [{"us": us, "prefetch": p} for us, p in ((3.0, False), (2.0, False), (9.0, True))]
    assert best_by_kind(rows) == {"plain": rows[1], "prefetch": rows[2]}
    assert best_by_kind(rows[:2]) == {"plain": rows[1]}
    assert best_by_kind([]) == {}
