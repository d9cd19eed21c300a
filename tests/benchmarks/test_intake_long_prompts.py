"""benchmarks/intake.py times prompts longer than its 16,384-token step budget.

Before: ``--lengths 32000`` failed with a ConfigError (max_num_batched_tokens 32000 below
max_model_len 32001 under prefill_first) instead of timing the add.
"""

from __future__ import annotations

from benchmarks.intake import time_intake


def test_a_prompt_past_the_default_step_budget_is_timed() -> None:
    row = time_intake(20000, 2)
    assert row["prompt_tokens"] == 20000 and row["requests"] == 2
    assert 0 < row["median_s"] < 1
