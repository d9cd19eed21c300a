"""The decode-attention sweep's cases: contexts like the reference's shrinking batch, and the
engine's current launch timed first beside variants that all differ from it."""

import random

import pytest

from benchmarks.decode_attention import engine_decode_lens, variants
from engine.attention_splits import choose_num_splits


def test_contexts_grow_as_the_batch_shrinks() -> None:
    rng = random.Random(0)
    full, late = engine_decode_lens(256, rng), engine_decode_lens(32, rng)
    assert len(full) == 256 and len(late) == 32
    assert min(full) >= 200 and max(full) <= 1124  # 100 steps in, prompts of 100-1,024
    assert sum(late) / 32 > sum(full) / 256 + 600


@pytest.mark.parametrize("batch", [1, 64, 256])
def test_current_launch_first_then_distinct_variants(batch: int) -> None:
    current = {"num_splits": choose_num_splits(batch, 8), "block_n": 64, "num_warps": 4,
               "num_stages": 3}  # fmt: skip
    cases = variants(current, batch, 8)
    assert cases[0] == {"label": "current", **current}
    knobs = [tuple(sorted((k, v) for k, v in c.items() if k != "label")) for c in cases]
    assert len(set(knobs)) == len(knobs)
    assert all(batch * 8 * c["num_splits"] <= 16384 for c in cases[1:])
