"""Start-up's warm-up of first uses (engine/runner/cuda_setup.py): what a run's first steps would
otherwise load on the engine thread (docs/gpu-notes.md, sessions 18 and 37)."""

from __future__ import annotations

import torch

from engine.runner.cuda_setup import _warm_up_first_uses


def test_the_lm_head_runs_at_every_row_count_up_to_the_batch_limit() -> None:
    """The LM head runs over a step's sampled rows (a decode's sequences, not its padded
    batch), so every row count up to the batch limit is one a run can take, each once, and
    never beyond it: session 37's first Azure recording stalled at decodes of 70-280 rows
    that the warm-up (1-64 rows and powers of two) had not run."""
    hidden = torch.randn(600, 8)
    seen: list[int] = []

    def compute_logits(rows: torch.Tensor) -> torch.Tensor:
        seen.append(rows.shape[0])
        return rows @ torch.ones(8, 3)

    _warm_up_first_uses(hidden, compute_logits, 512, torch.device("cpu"))
    assert seen == list(range(1, 513))
    seen.clear()
    _warm_up_first_uses(hidden, compute_logits, 12, torch.device("cpu"))
    assert seen == list(range(1, 13))
