"""Shared by the cost-model tests: a model's predicted intervals, as the simulator prices steps;
a stand-in model that keeps the features the simulator prices each step by; a step law whose
prefill attention work is counted as a model fitted with the default options counts it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from engine.batch import ScheduledBatch
from replay.whatif.cost.model import CostModel, StepTime
from replay.whatif.cost.options import CostOptions
from replay.whatif.synthetic import StepLaw


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


@dataclass(frozen=True)
class CausalLaw(StepLaw):
    """``StepLaw`` whose prefill attention takes time per unit of work as the causal mask
    computes it (``linear.causal_work``: each prompt's new tokens x context less half its new
    tokens squared) where ``causal_work``; default: ``CostOptions``' default, so a model fitted
    with the default options prices the law's own features and recovers it exactly. Each prefill
    row's context is taken as ``context - new / 2``: ``StepLaw``'s work, the sum of new x context,
    is then the causal work, and its noise, flushes and padding apply as before."""

    causal_work: bool = CostOptions.causal_work

    def duration(self, batch: ScheduledBatch, padded: int, rng: np.random.Generator,
                 padded_rows: int = 0) -> float:
        prompts = batch.num_prefill_seqs
        if self.causal_work and prompts:
            contexts = [c - q / 2 for q, c in zip(batch.num_new_tokens[:prompts],
                                                  batch.context_lens[:prompts])]
            batch = replace(batch, context_lens=contexts + list(batch.context_lens[prompts:]))
        return super().duration(batch, padded, rng, padded_rows)
