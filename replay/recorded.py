"""A recorded event stream as numpy columns, whatever it was read from (Parquet or memory)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.sampling_params import SamplingParams
from tracing.export import arrivals_on_the_clock
from tracing.schema import EVENT_KINDS, NO_SEED, all_columns, decode_stop

LIST_COLUMNS = frozenset({"prompt_token_ids"})
# Columns whose name ``RecordedEvents.row`` keeps for the event's own kind.
ROW_KEYS = {"kind": "batch_kind"}


@dataclass
class RecordedEvents:
    """Header plus, per event kind, column name -> numpy array (list columns stay Python lists).

    ``last_step`` is the last step the recording fully contains (the whole run for a complete
    trace; less for one whose recording process died).
    """

    header: dict[str, Any]
    tables: dict[str, dict[str, Any]]
    last_step: int
    complete: bool = True
    # Committed segments the reader left unread (``Trace.unread_note``: a copy taken while the
    # trace was being recorded), or None.
    unread_note: str | None = None

    def column(self, kind: str, name: str) -> Any:
        return self.tables[kind][name]

    def request_params(self, row: int) -> SamplingParams:
        """The sampling settings of the ``row``-th recorded request (``request_added``)."""
        added = self.tables["request_added"]
        seed = int(added["seed"][row])
        return SamplingParams(
            temperature=float(added["temperature"][row]),
            max_tokens=int(added["max_tokens"][row]),
            ignore_eos=bool(added["ignore_eos"][row]),
            top_p=float(added["top_p"][row]),
            top_k=int(added["top_k"][row]),
            seed=None if seed == NO_SEED else seed,
            stop=decode_stop(str(added["stop"][row])),
        )

    def request_priority(self, row: int) -> int:
        """The priority of the ``row``-th recorded request (0 before schema 5)."""
        return int(self.tables["request_added"]["priority"][row])

    def num_rows(self, kind: str) -> int:
        return len(self.tables[kind]["event_id"])

    @property
    def num_events(self) -> int:
        return sum(self.num_rows(kind) for kind in EVENT_KINDS)

    @property
    def num_steps(self) -> int:
        return len(self.tables["model_step"]["event_id"])

    def row(self, kind: str, index: int) -> dict[str, Any]:
        """One event as a dict (for reports): ``kind`` is the event's kind; a column of that
        name (the batch kind of ``batch_scheduled`` and ``model_step``) is ``batch_kind``."""
        out: dict[str, Any] = {"kind": kind}
        for name, values in self.tables[kind].items():
            value = values[index]
            out[ROW_KEYS.get(name, name)] = value.item() if isinstance(value, np.generic) else value
        return out


def keep_rows(cols: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    """The rows of one event table where ``keep`` is true (list columns stay lists)."""
    return {
        name: [v for v, k in zip(values, keep) if k]
        if name in LIST_COLUMNS
        else np.asarray(values)[keep]
        for name, values in cols.items()
    }


def _as_array(name: str, values: Any) -> Any:
    if name in LIST_COLUMNS:
        return [list(v) for v in values]
    if isinstance(values, np.ndarray):
        return values
    return np.asarray(values)


def from_columns(
    header: dict[str, Any], tables: dict[str, dict[str, list]], complete: bool = True
) -> RecordedEvents:
    """Wrap in-memory tables (``MemorySink.tables`` or ``EventBuffer.tables``)."""
    converted = {
        kind: {name: _as_array(name, tables[kind][name]) for name in all_columns(kind)}
        for kind in EVENT_KINDS
    }
    last_step = max((int(cols["step"].max()) for cols in converted.values() if len(cols["step"])),
                    default=-1)
    return RecordedEvents(header, _arrivals_on_the_clock(converted), last_step, complete)


def from_trace(trace: Any) -> RecordedEvents:
    """Wrap a trace opened by ``tracing.read_trace``: its tables, which for an incomplete trace
    hold only the fully recorded steps (0 to ``last_step``, ``tracing.commits.Commits``)."""
    converted = {kind: trace.columns(kind) for kind in EVENT_KINDS}
    return RecordedEvents(dict(trace.header), _arrivals_on_the_clock(converted),
                          int(trace.last_step), bool(trace.complete),
                          getattr(trace, "unread_note", None))


def _arrivals_on_the_clock(tables: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``tables`` with every ``request_added.arrival_s`` a time on the engine's clock, which
    a replay and a what-if hand back to ``EngineCore.add_request``: one not recorded as such
    takes the export's stand-in (``tracing.export.arrivals_on_the_clock``, the one rule)."""
    added, steps = tables["request_added"], tables["model_step"]
    arrival, measured = arrivals_on_the_clock(added["arrival_s"], added["added_s"],
                                              added["step"], steps["step"],
                                              steps["wall_time_s"])
    if measured.all():
        return tables
    return {**tables, "request_added": {**added, "arrival_s": arrival}}
