"""Recipe tokens: the batch without named blocks (no masks, in place) follows the same rule.

What this proves: ``recipe_tokens`` on a batch of recipes that name no blocks (its tail-only fast
path) gives every recipe the tokens the masked path gives it (the same batch with one named
recipe added, which takes the masked path); and ``_mix`` on an array, in place or not, equals the
plain-int ``_mix_int`` element by element (the rule written independently).
"""

from __future__ import annotations

import numpy as np

from replay.workloads.recipe import PromptRecipe, _mix, _mix_in_place, _mix_int, recipe_tokens


def test_tail_only_batches_get_the_masked_paths_tokens() -> None:
    rng = np.random.default_rng(4)
    plain = [PromptRecipe((), 16, int(n), salt=int(s)) for n, s in
             zip(rng.integers(1, 600, 40), rng.integers(-5, 2**63, 40))]
    named = PromptRecipe((3, 4), 16, 50, salt=1)
    fast = recipe_tokens(plain)
    masked = recipe_tokens(plain + [named])
    assert len(fast) == len(plain)
    for mine, theirs, recipe in zip(fast, masked, plain):
        assert mine.dtype == np.int32 and len(mine) == recipe.length
        assert mine.tolist() == theirs.tolist()
    assert recipe_tokens([named])[0].tolist() == masked[-1].tolist()


def test_mix_equals_the_plain_int_rule() -> None:
    values = np.random.default_rng(5).integers(0, 2**63, 64, dtype=np.uint64) * np.uint64(3)
    expected = [_mix_int(int(v)) for v in values]
    assert _mix(values).tolist() == expected
    copy = values.copy()
    assert _mix_in_place(copy) is copy and copy.tolist() == expected
