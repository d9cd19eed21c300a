"""``extend_each`` is ``Sequence.extend_tokens`` for many sequences at once.

What this proves: for int32-array and list sequences alike, ``extend_each`` with the bytes of an
int32 token matrix leaves each sequence exactly as ``extend_tokens`` with its row does (tokens,
their form, ``last_token``, ``num_tokens``, ``num_computed_tokens``).
"""

from __future__ import annotations

from array import array

import numpy as np

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence, extend_each


def _state(seq: Sequence) -> tuple:
    return (type(seq.token_ids), list(seq.token_ids), seq.last_token, seq.num_tokens,
            seq.num_computed_tokens)


def test_extend_each_equals_extend_tokens_row_by_row() -> None:
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 2**31 - 1, (5, 3)).astype(np.int32)
    prompts = [rng.integers(0, 1000, 4 + i).tolist() for i in range(5)]
    forms = [array("i", p) if i % 2 else p for i, p in enumerate(prompts)]
    mine = [Sequence(i, form, SamplingParams()) for i, form in enumerate(forms)]
    theirs = [Sequence(i, form, SamplingParams()) for i, form in enumerate(forms)]
    extend_each(mine, rows.tobytes(), 3, rows[:, -1].tolist())
    for seq, row in zip(theirs, rows.tolist()):
        seq.extend_tokens(row)
    assert [_state(s) for s in mine] == [_state(s) for s in theirs]
    assert isinstance(mine[1].token_ids, array) and isinstance(mine[0].token_ids, list)
