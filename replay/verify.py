"""``verify``: replay a recording; find the first event where today's engine decides otherwise.

``compare_decisions`` compares two runs whose sampled tokens may differ (a prediction of
configuration B against B's recording): it blanks the columns holding token values or values
derived from them (token ids, block hashes, output hashes) and the executor's own choices
(CUDA-graph padding), then compares every decision; measured columns (times) are never compared.

What a verify proves depends on what the trace holds:

- a complete trace: every decision of the run. A run that scheduled no step (given no request
  through the API; ``replayllm run`` refuses an empty workload) verifies too, "identical: N
  events over 0 steps (complete trace of a run that scheduled no step)": the record is whole,
  and the replay schedules nothing either (its rejections, if any, are compared);
- an incomplete trace (a killed run: no ``summary.json``) with committed steps: the decisions of
  the recorded prefix, steps 0 to ``last_step``, and the report says so;
- an incomplete trace with no committed step: nothing, so ``check_verifiable`` refuses it with a
  ``TraceError`` (``replayllm verify``: one line, exit 2, as for a damaged trace) rather than
  report zero checked steps as "identical".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.policy import policy_change_note
from replay.recorded import (
    LIST_COLUMNS,
    ROW_KEYS,
    RecordedEvents,
    from_columns,
    from_trace,
    keep_rows,
)
from replay.replayer import replay
from tracing.errors import TraceError
from tracing.schema import COMPARED_SINCE, EVENT_KINDS, MEASURED_COLUMNS, all_columns

CONTEXT_EVENTS = 6


@dataclass
class Divergence:
    """The first event (by event id) where the recording and the replay differ."""

    event_id: int
    step: int
    recorded: dict[str, Any] | None
    replayed: dict[str, Any] | None
    columns: list[str]
    context: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class VerifyResult:
    """Outcome of a verify: identical, or the first divergence."""

    identical: bool
    num_events: int
    num_steps: int
    complete: bool
    divergence: Divergence | None = None
    replay_note: str | None = None
    # The recorded user policy's source changed (engine.policy.policy_change_note), or None.
    policy_note: str | None = None
    # The last step verified: the recording's last fully recorded step (-1: none).
    last_step: int = -1
    # Committed segments the reader left unread (``Trace.unread_note``), or None.
    unread_note: str | None = None
    # Requests of the recorded prefix and how many of them it leaves unfinished.
    num_requests: int = 0
    unfinished: int = 0

    def scope(self) -> str:
        """How far the trace was verified: "" for a complete one with steps."""
        if self.complete:
            return "" if self.num_steps else " (complete trace of a run that scheduled no step)"
        return (f" (incomplete trace: verified the recorded prefix, steps 0 to "
                f"{self.last_step})")

    def unfinished_part(self) -> str:
        """What an incomplete trace leaves unverified: the requests unfinished where it ends,
        whose later steps it does not hold (nor a step cut by a kill or an error, dropped with
        the requests added for it: ``engine/step_cut.py``); "" for a complete trace."""
        if self.complete:
            return ""
        return f", {self.unfinished} of its {self.num_requests} requests unfinished where it ends"

    def report(self) -> str:
        """The text ``replayllm verify`` prints."""
        scope = self.scope()
        note = [f"note: {self.unread_note}"] if self.unread_note else []
        if self.identical:
            return "\n".join([f"identical: {self.num_events} events over {self.num_steps} "
                              f"steps{self.unfinished_part()}{scope}", *note])
        d = self.divergence
        assert d is not None  # identical is False only with a divergence
        kind = (d.recorded or d.replayed or {}).get("kind", "?")
        # A replay that stopped early is the cause: said first, not after the table.
        stopped = f"; replay stopped: {self.replay_note}" if self.replay_note else ""
        lines = [f"diverged at event {d.event_id} (step {d.step}, {kind}){scope}{stopped}",
                 *note]
        lines.append(_side_by_side(d))
        if d.context:
            lines.append("last events before it (recorded):")
            lines += ["  " + _one_line(e) for e in d.context]
        return "\n".join(lines)


def _one_line(event: dict[str, Any]) -> str:
    fields = " ".join(
        f"{k}={_short(v)}" for k, v in event.items() if k not in ("kind", "event_id", "step")
    )
    return f"#{event['event_id']} step {event['step']} {event['kind']}: {fields}"


def _short(value: Any) -> str:
    if isinstance(value, list) and len(value) > 8:
        return f"[{', '.join(map(str, value[:8]))}, ... ({len(value)} items)]"
    return str(value)


def _side_by_side(d: Divergence) -> str:
    rec, rep = d.recorded or {}, d.replayed or {}
    names = list(dict.fromkeys([*rec.keys(), *rep.keys()]))
    width = max(len(n) for n in names) if names else 6
    # Two events of one kind differ only in compared columns: measurements (times) are shown,
    # never marked, as verify never compares them.
    kind = rec.get("kind") if rec.get("kind") == rep.get("kind") else None
    measured = {ROW_KEYS.get(n, n) for n in MEASURED_COLUMNS.get(kind, ())} if kind else set()
    rows = [f"  {'column':<{width}}  {'recorded':>24}  {'replayed':>24}"]
    for name in names:
        a = _short(rec.get(name, "-")) if d.recorded else "(no event)"
        b = _short(rep.get(name, "-")) if d.replayed else "(no event)"
        mark = "  <--" if a != b and name not in measured else ""
        rows.append(f"  {name:<{width}}  {a:>24}  {b:>24}{mark}")
    return "\n".join(rows)


def _first_mismatch(kind: str, rec: RecordedEvents, rep: RecordedEvents) -> tuple[int, list[str]]:
    """Row index of the first differing row of one kind (or the shorter length), and columns."""
    n_rec, n_rep = rec.num_rows(kind), rep.num_rows(kind)
    common = min(n_rec, n_rep)
    skip = MEASURED_COLUMNS.get(kind, frozenset()) | _not_recorded(kind, rec.header)
    first = common
    for name in all_columns(kind):
        if name in skip:
            continue
        a, b = rec.column(kind, name), rep.column(kind, name)
        if name in LIST_COLUMNS:
            hits = [i for i in range(common) if list(a[i]) != list(b[i])]
        else:
            hits = np.flatnonzero(np.asarray(a[:common]) != np.asarray(b[:common])).tolist()
        if hits and hits[0] < first:
            first = hits[0]
    if first == common and n_rec == n_rep:
        return -1, []
    differing = []
    if first < common:
        differing = [
            name
            for name in all_columns(kind)
            if name not in skip and _value(rec, kind, name, first) != _value(rep, kind, name, first)
        ]
    return first, differing


def _not_recorded(kind: str, header: dict[str, Any]) -> frozenset[str]:
    """Columns of ``kind`` the recording's schema version did not store (``COMPARED_SINCE``)."""
    version = header.get("schema_version")
    since = COMPARED_SINCE.get(kind, {})
    if not isinstance(version, int):
        return frozenset(since)
    return frozenset(name for name, first in since.items() if version < first)


def _value(events: RecordedEvents, kind: str, name: str, index: int) -> Any:
    value = events.column(kind, name)[index]
    return list(value) if name in LIST_COLUMNS else value


def _event_by_id(events: RecordedEvents, event_id: int) -> dict[str, Any] | None:
    for kind in EVENT_KINDS:
        ids = np.asarray(events.column(kind, "event_id"))
        index = int(np.searchsorted(ids, event_id))
        if index < len(ids) and ids[index] == event_id:
            return events.row(kind, index)
    return None


def _context(events: RecordedEvents, event_id: int) -> list[dict[str, Any]]:
    found = []
    for kind in EVENT_KINDS:
        ids = np.asarray(events.column(kind, "event_id"))
        lo = int(np.searchsorted(ids, event_id - CONTEXT_EVENTS))
        hi = int(np.searchsorted(ids, event_id))
        found += [events.row(kind, i) for i in range(lo, hi)]
    return sorted(found, key=lambda e: e["event_id"])


def compare(recorded: RecordedEvents, replayed: RecordedEvents) -> Divergence | None:
    """The first divergence between two event streams, or None when every decision matches."""
    best: tuple[int, str, int, list[str]] | None = None
    for kind in EVENT_KINDS:
        index, columns = _first_mismatch(kind, recorded, replayed)
        if index < 0:
            continue
        candidates = [
            int(np.asarray(s.column(kind, "event_id"))[index])
            for s in (recorded, replayed)
            if index < s.num_rows(kind)
        ]
        event_id = min(candidates)
        if best is None or event_id < best[0]:
            best = (event_id, kind, index, columns)
    if best is None:
        return None
    event_id, kind, _, columns = best
    rec_event = _event_by_id(recorded, event_id)
    rep_event = _event_by_id(replayed, event_id)
    step = (rec_event or rep_event or {}).get("step", -1)
    return Divergence(
        event_id=event_id,
        step=int(step),
        recorded=rec_event,
        replayed=rep_event,
        columns=columns,
        context=_context(recorded, event_id),
    )


def cut_to_step(events: RecordedEvents, last_step: int) -> RecordedEvents:
    """The events of steps <= ``last_step`` (a run's prefix, to set beside an incomplete
    recording of it)."""
    tables = {
        kind: keep_rows(cols, np.asarray(cols["step"]) <= last_step)
        for kind, cols in events.tables.items()
    }
    return RecordedEvents(events.header, tables, last_step, events.complete)


NOTHING_COMMITTED = ("incomplete trace with no committed step (the recording stopped before "
                     "its first step was committed): nothing to verify")


def check_verifiable(trace: Any) -> None:
    """Raise ``TraceError`` (one line) for a trace a verify proves nothing about: incomplete,
    with no step committed. ``trace``: a trace from ``read_trace`` or ``RecordedEvents``."""
    if not trace.complete and trace.last_step < 0:
        where = getattr(trace, "path", None)
        unread = getattr(trace, "unread_note", None)
        what = f"{unread}: nothing to verify" if unread else NOTHING_COMMITTED
        raise TraceError(f"{where}: {what}" if where else what)


def verify_recorded(recorded: RecordedEvents) -> VerifyResult:
    """Replay ``recorded`` and compare every decision event with it (``check_verifiable``
    first: an incomplete recording with no committed step raises ``TraceError``)."""
    check_verifiable(recorded)
    run = replay(recorded)
    replayed = run.replayed
    if not recorded.complete:
        replayed = cut_to_step(replayed, recorded.last_step)
    divergence = compare(recorded, replayed)
    return VerifyResult(
        identical=divergence is None,
        num_events=recorded.num_events,
        num_steps=recorded.num_steps,
        complete=recorded.complete,
        divergence=divergence,
        replay_note=run.stopped_early if divergence is not None else None,
        policy_note=policy_change_note(recorded.header),
        last_step=int(recorded.last_step),
        num_requests=recorded.num_rows("request_added"),
        unfinished=len(_unfinished(recorded)),
    )


def _unfinished(recorded: RecordedEvents) -> set[int]:
    """The recorded requests without a ``request_finished`` event."""
    added = np.asarray(recorded.column("request_added", "seq_id")).tolist()
    return set(added) - set(np.asarray(recorded.column("request_finished", "seq_id")).tolist())


def verify_events(header: dict[str, Any], tables: dict[str, dict[str, list]]) -> VerifyResult:
    """Verify an in-memory recording (``MemorySink.header`` and ``MemorySink.tables``)."""
    return verify_recorded(from_columns(header, tables))


def verify(trace: Any) -> VerifyResult:
    """Verify a trace: a path to a trace directory or a trace opened with ``read_trace``."""
    if isinstance(trace, (str, bytes)) or hasattr(trace, "__fspath__"):
        from tracing.reader import read_trace

        trace = read_trace(trace)
    check_verifiable(trace)  # before reading the tables, naming the trace
    result = verify_recorded(from_trace(trace))
    result.unread_note = getattr(trace, "unread_note", None)
    return result


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
