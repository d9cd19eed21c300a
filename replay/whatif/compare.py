"""What ``whatif --compare`` sets side by side: a prediction and the recording it predicts.

The recording must hold the prediction's workload (``check_same_workload``). When it is
complete, every figure of both runs is compared. When it is incomplete (a killed run: no
``summary.json``), its figures cover only the steps it committed: some requests finished there,
the rest were still queued or running, while the prediction runs the whole workload to its end.
Set side by side as they are, the two differ by what the recording lost, not by any error of
the prediction (a makespan "off by +250%"). So ``RecordedScope`` restricts both sides alike:

- the requests compared are those the recording finished (matched by ``seq_id``, as the
  decision comparison matches them); per-request figures (TTFT, TPOT, e2e, queue), completion
  tokens and preemptions are theirs only;
- each side's run is cut at the step where the last of those requests finished, so the step
  figures (steps, makespan, throughput, batch size, KV blocks, prefix hit rate) cover the same
  stretch of the run on both sides (the same steps, when the decisions agree);
- the decision streams are compared over the steps the recording committed.

A recording that finished no request leaves nothing to compare: ``scope_of`` raises
``ReplayLLMError`` (one line, exit 2) instead of printing a table of nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ReplayLLMError
from replay.recorded import RecordedEvents, keep_rows

# Event kinds whose rows belong to one request and feed its per-request figures.
PER_REQUEST_KINDS = ("request_added", "seq_scheduled", "token_sampled", "request_finished",
                     "preempted")


def check_same_workload(workload: Any, other: RecordedEvents, other_name: str) -> None:
    """Raise ``ReplayLLMError`` unless ``other`` recorded ``workload``'s requests (prompt
    lengths and max_tokens, in order); an incomplete recording may hold only the first ones."""
    added = other.tables["request_added"]
    ours = [(len(r.prompt), r.params.max_tokens) for r in workload.requests]
    theirs = list(zip(np.asarray(added["prompt_len"]).tolist(),
                      np.asarray(added["max_tokens"]).tolist()))
    same = ours == theirs if other.complete else ours[:len(theirs)] == theirs
    if not same:
        raise ReplayLLMError(
            f"{other_name} ran another workload than {workload.name} ({len(theirs)} vs "
            f"{len(ours)} requests, or other prompt lengths / max_tokens); --compare needs the "
            "same requests"
        )


@dataclass(frozen=True)
class RecordedScope:
    """The requests an incomplete recording finished, out of the workload's ``total``."""

    name: str
    seq_ids: np.ndarray
    total: int
    last_step: int

    @property
    def finished(self) -> int:
        return len(self.seq_ids)

    def warning(self) -> str:
        """The line ``--compare`` prints before its table."""
        return (f"{self.name} is incomplete (the recording stopped; committed through step "
                f"{self.last_step}): it finished {self.finished} of the {self.total} requests; "
                f"comparing only those {self.finished}, each run up to the step that finished "
                "the last of them")

    def note(self) -> str:
        """The same, for the ``notes`` column of summary.parquet."""
        return (f"compared over the {self.finished} of {self.total} requests the incomplete "
                f"recording {self.name} finished")

    def restrict(self, events: RecordedEvents) -> RecordedEvents:
        """``events`` through the step where the last of the scope's requests finished, with
        the per-request rows of those requests only (see the module's docstring)."""
        finished = events.tables["request_finished"]
        mine = np.isin(np.asarray(finished["seq_id"], dtype=np.int64), self.seq_ids)
        steps = np.asarray(finished["step"], dtype=np.int64)[mine]
        last = int(steps.max()) if len(steps) else -1
        tables = {}
        for kind, cols in events.tables.items():
            keep = np.asarray(cols["step"], dtype=np.int64) <= last
            if kind in PER_REQUEST_KINDS:
                keep &= np.isin(np.asarray(cols["seq_id"], dtype=np.int64), self.seq_ids)
            tables[kind] = keep_rows(cols, keep)
        return RecordedEvents(events.header, tables, last, events.complete)


def scope_of(other: RecordedEvents, total: int, other_name: str) -> RecordedScope | None:
    """None for a complete recording (everything is compared); for an incomplete one, the
    requests it finished. Raises ``ReplayLLMError`` when it finished none."""
    if other.complete:
        return None
    seq_ids = np.unique(np.asarray(other.tables["request_finished"]["seq_id"], dtype=np.int64))
    if not len(seq_ids):
        stopped = ("committed no step" if other.last_step < 0
                   else f"committed through step {other.last_step}")
        raise ReplayLLMError(f"{other_name} is incomplete (the recording stopped; {stopped}) "
                             f"and finished none of the {total} requests: nothing to compare")
    return RecordedScope(other_name, seq_ids, total, int(other.last_step))
