"""The decode-attention kernel's split rule, torch-free (the what-if prices decodes by it)."""

import pytest

from engine.attention_splits import MAX_SPLITS, TARGET_PROGRAMS, choose_num_splits, decode_grid


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


@pytest.mark.parametrize("heads_fastest", [True, False])
def test_decode_grid_launches_each_row_whole_before_the_next(heads_fastest: bool) -> None:
    # Blocks are dispatched in linear order (x fastest): with the rows longest first, every
    # split of the longest row must come before any program of the second row, or a long row
    # among few runs its last splits a wave late (the kernel's docstring).
    rows, heads, splits = 3, 8, 16
    grid = decode_grid(rows, heads, splits, heads_fastest)
    assert grid[0] * grid[1] * grid[2] == rows * heads * splits
    assert grid[2] == rows
    row_of_linear = [z for z in range(grid[2]) for _ in range(grid[1]) for _ in range(grid[0])]
    assert row_of_linear == sorted(row_of_linear)
    assert (grid[0] == heads) == heads_fastest
