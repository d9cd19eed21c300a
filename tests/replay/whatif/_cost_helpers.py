"""Shared by the cost-model tests: a model's predicted intervals, as the simulator prices steps;
a stand-in model that keeps the features the simulator prices each step by."""

from __future__ import annotations

import numpy as np

from replay.whatif.cost.model import CostModel, StepTime


def predicted_intervals(model: CostModel, x: np.ndarray, classes: np.ndarray,
                        overlapped: np.ndarray | None = None) -> np.ndarray:
    """Each step's interval by ``CostModel.predict`` (``overlapped`` default: none; no step
    pays one-off first-step costs)."""
    flags = np.zeros(len(x), dtype=bool) if overlapped is None else np.asarray(overlapped, bool)
    return np.array([model.predict(row.tolist(), str(name), bool(flag)).interval_s
                     for row, name, flag in zip(x, classes, flags)])


class RecordingCost:
    """A stand-in step-time model that keeps the features the simulator prices a step by
    (``causal_work``: as ``CostModel.causal_work``)."""

    graph_sizes: list[int] = []
    prefill_graph_sizes: list[int] = []
    prefill_graph_max_seqs = 0
    kv_heads, shared_kv = 8, False
    source, mode = "test", "overlap"

    def __init__(self, causal_work: bool = False) -> None:
        self.causal_work = causal_work
        self.seen: list = []

    def predict(self, step, cls_name, overlapped=False, first=False) -> StepTime:
        self.seen.append(step)
        return StepTime(1e-3, 1e-4, 1e-3)
