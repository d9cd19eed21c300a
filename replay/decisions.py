"""Compare the scheduling decisions of two runs whose sampled tokens may differ.

A real model under configuration B samples other tokens than under A (temperature > 0), so a
prediction of B made from A's trace cannot match B's recording token for token. What must match
(for a workload whose decisions do not depend on token values) is every decision: which
sequences ran in which step, with how many tokens, which blocks were allocated, hit, freed and
preempted. This module blanks the columns holding token values or values derived from them
(token ids, block hashes, output hashes) and the executor's own choices (CUDA-graph padding),
then runs ``replay.verify.compare``, which already skips measured columns (times).
"""

from __future__ import annotations

import numpy as np

from replay.recorded import RecordedEvents
from replay.verify import Divergence, compare

# Columns whose values are sampled token ids or hashes over them.
TOKEN_COLUMNS: dict[str, frozenset[str]] = {
    "token_sampled": frozenset({"token_id"}),
    "block_hit": frozenset({"hash"}),
    "block_hashed": frozenset({"hash", "parent_hash"}),
    "request_finished": frozenset({"output_hash"}),
}
# Columns the executor decides (graph padding), not the scheduler.
EXECUTOR_COLUMNS: dict[str, frozenset[str]] = {
    "model_step": frozenset({"padded_batch_size", "padded_tokens", "graph_used"}),
}


def ignored_columns() -> dict[str, frozenset[str]]:
    """Kind -> columns a decision comparison leaves out (besides the measured ones)."""
    kinds = set(TOKEN_COLUMNS) | set(EXECUTOR_COLUMNS)
    return {
        kind: TOKEN_COLUMNS.get(kind, frozenset()) | EXECUTOR_COLUMNS.get(kind, frozenset())
        for kind in sorted(kinds)
    }


def blank_columns(events: RecordedEvents, columns: dict[str, frozenset[str]]) -> RecordedEvents:
    """A shallow copy of ``events`` with the named columns replaced by zeros."""
    tables = {kind: dict(cols) for kind, cols in events.tables.items()}
    for kind, names in columns.items():
        for name in names:
            tables[kind][name] = np.zeros(len(tables[kind]["event_id"]), dtype=np.int64)
    return RecordedEvents(events.header, tables, events.last_step, events.complete)


def compare_decisions(expected: RecordedEvents, actual: RecordedEvents) -> Divergence | None:
    """The first decision where the two streams differ, token values and times aside."""
    ignored = ignored_columns()
    return compare(blank_columns(expected, ignored), blank_columns(actual, ignored))


def describe_divergence(divergence: Divergence | None) -> str:
    """One line: identical, or where and in which columns the decisions part."""
    if divergence is None:
        return "identical decision streams"
    kind = (divergence.recorded or divergence.replayed or {}).get("kind", "?")
    columns = ", ".join(divergence.columns) or "stream length"
    return (
        f"decisions differ from event {divergence.event_id} (step {divergence.step}, {kind}: "
        f"{columns})"
    )
