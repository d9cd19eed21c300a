"""The decode-attention kernel's split rule, torch-free (the what-if prices decodes by it)."""

import pytest

from engine.attention_splits import MAX_SPLITS, TARGET_PROGRAMS, choose_num_splits


def test_splits_fill_the_target_program_count_in_powers_of_two() -> None:
    for kv_heads in (1, 2, 8):
        for seqs in range(1, 600):
            splits = choose_num_splits(seqs, kv_heads)
            assert splits & (splits - 1) == 0 and 1 <= splits <= MAX_SPLITS
            # The fewest splits that reach the target, unless capped.
            assert splits == MAX_SPLITS or seqs * kv_heads * splits >= TARGET_PROGRAMS
            assert splits == 1 or seqs * kv_heads * (splits // 2) < TARGET_PROGRAMS


def test_a_large_batch_runs_one_program_per_sequence_and_head() -> None:
    assert choose_num_splits(128, 8) == 1 and choose_num_splits(4, 8) == MAX_SPLITS
    assert choose_num_splits(0, 8) == MAX_SPLITS  # an empty launch: nothing to divide by zero


def test_tiling_by_batch_switches_at_the_threshold_and_fixed_never_does() -> None:
    from engine.attention_splits import (
        FIXED_TILING,
        WIDE_TILING,
        WIDE_TILING_MIN_SEQS,
        decode_tiling,
    )

    assert decode_tiling(WIDE_TILING_MIN_SEQS - 1, "by_batch") == FIXED_TILING
    assert decode_tiling(WIDE_TILING_MIN_SEQS, "by_batch") == WIDE_TILING
    assert {decode_tiling(n, "fixed") for n in range(1, 600)} == {FIXED_TILING}
    with pytest.raises(ValueError, match="by_batch"):
        decode_tiling(4, "wide")


def test_launch_variants_name_one_batch_per_distinct_launch() -> None:
    from engine.attention_splits import decode_tiling, launch_variants

    for rule in ("fixed", "by_batch"):
        batches = launch_variants(512, 8, rule)
        launches = {(choose_num_splits(b, 8), decode_tiling(b, rule)) for b in range(1, 513)}
        assert len(batches) == len(launches)
        assert {(choose_num_splits(b, 8), decode_tiling(b, rule)) for b in batches} == launches
    assert len(launch_variants(512, 8, "by_batch")) == len(launch_variants(512, 8, "fixed")) + 1
