"""Shared by the cost-model tests: a model's predicted intervals, as the simulator prices steps."""

from __future__ import annotations

import numpy as np

from replay.whatif.cost.model import CostModel


def predicted_intervals(model: CostModel, x: np.ndarray, classes: np.ndarray,
                        overlapped: np.ndarray | None = None) -> np.ndarray:
    """Each step's interval by ``CostModel.predict`` (``overlapped`` default: none; no step
    pays one-off first-step costs)."""
    flags = np.zeros(len(x), dtype=bool) if overlapped is None else np.asarray(overlapped, bool)
    return np.array([model.predict(row.tolist(), str(name), bool(flag)).interval_s
                     for row, name, flag in zip(x, classes, flags)])
