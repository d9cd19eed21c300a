"""An executor that answers each step with the tokens a trace recorded for it."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.batch import ScheduledBatch, StepOutput
from replay.recorded import RecordedEvents


class ReplayDiverged(Exception):
    """The scheduler asked for tokens the recording does not have: decisions already differ."""

    def __init__(self, step: int, detail: str) -> None:
        super().__init__(f"step {step}: {detail}")
        self.step = step


def _group_by_step(steps: np.ndarray, *columns: np.ndarray) -> dict[int, tuple[list, ...]]:
    """Split step-sorted columns into per-step Python lists."""
    if len(steps) == 0:
        return {}
    order = np.argsort(steps, kind="stable")
    steps = steps[order]
    columns = tuple(c[order] for c in columns)
    unique, starts = np.unique(steps, return_index=True)
    ends = np.append(starts[1:], len(steps))
    return {
        int(step): tuple(c[a:b].tolist() for c in columns)
        for step, a, b in zip(unique, starts, ends)
    }


class TraceExecutor:
    """Returns, for step ``s``, the tokens recorded at step ``s`` for the same sequences.

    If the scheduler's batch samples other sequences than the recording did, it raises
    ``ReplayDiverged``: the decision events emitted so far already show where they part.
    """

    def __init__(self, recorded: RecordedEvents, num_kvcache_blocks: int) -> None:
        self.num_kvcache_blocks = num_kvcache_blocks
        tokens = recorded.tables["token_sampled"]
        self._tokens = _group_by_step(
            np.asarray(tokens["step"]), np.asarray(tokens["seq_id"]), np.asarray(tokens["token_id"])
        )
        steps = recorded.tables["model_step"]
        self._steps = {
            int(step): (float(duration), int(padded), bool(graph), int(tokens))
            for step, duration, padded, graph, tokens in zip(
                np.asarray(steps["step"]).tolist(),
                np.asarray(steps["duration_s"]).tolist(),
                np.asarray(steps["padded_batch_size"]).tolist(),
                np.asarray(steps["graph_used"]).tolist(),
                np.asarray(steps["padded_tokens"]).tolist(),
            )
        }

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        measured = self._steps.get(batch.step)
        if measured is None:
            raise ReplayDiverged(batch.step, "the recording has no model step here")
        wanted = [seq.seq_id for seq in batch.sampled_seqs]
        seq_ids, token_ids = self._tokens.get(batch.step, ([], []))
        if seq_ids != wanted:
            raise ReplayDiverged(
                batch.step, f"replay samples sequences {wanted[:8]}..., recording {seq_ids[:8]}..."
            )
        duration, padded, graph, padded_tokens = measured
        return StepOutput(
            token_ids=token_ids, duration_s=duration, padded_batch_size=padded, graph_used=graph,
            padded_tokens=padded_tokens,
        )

    def describe(self) -> dict[str, Any]:
        return {"executor": "trace"}

    def close(self) -> None:
        pass
