"""Start-up's warm-up of first uses (engine/runner/cuda_setup.py): what a run's first steps would
otherwise load on the engine thread (docs/gpu-notes.md, session 18)."""

from __future__ import annotations

import torch

from engine.runner.cuda_setup import WARM_LOGITS_ROWS, _warm_up_first_uses


def test_the_lm_head_runs_at_every_small_row_count_and_each_power_of_two() -> None:
    """Every row count a prefill's prompts give up to ``WARM_LOGITS_ROWS``, each power of two
    (the decode graphs' padded batches) up to the batch limit, and never beyond it."""
    hidden = torch.randn(600, 8)
    seen: list[int] = []

    def compute_logits(rows: torch.Tensor) -> torch.Tensor:
        seen.append(rows.shape[0])
        return rows @ torch.ones(8, 3)

    _warm_up_first_uses(hidden, compute_logits, 512, torch.device("cpu"))
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert set(seen) == set(range(1, WARM_LOGITS_ROWS + 1)) | {128, 256, 512}
    seen.clear()
    _warm_up_first_uses(hidden, compute_logits, 12, torch.device("cpu"))
    assert seen == list(range(1, 13))
