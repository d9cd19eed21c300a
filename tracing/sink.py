"""Sinks: where the engine's event buffer goes at the end of each step."""

from __future__ import annotations

from typing import Any, Protocol

from tracing.events import EventBuffer
from tracing.schema import EVENT_KINDS, all_columns


class EventSink(Protocol):
    """Where events go. The engine owns the ``EventBuffer``; a sink decides when to drain it.

    A sink that needs no per-sequence rows may also say so (``takes_decode_stretches``: True)
    and take ``add_decode_stretch(seq_ids, first_step, sampled)`` instead of a decode stretch's
    ``seq_scheduled`` and ``token_sampled`` rows (``engine/decode_stretch.py``; the
    simulator's ``StreamingMetrics`` does when nothing is written on). A sink that reads no
    prompt tokens may say so too (``needs_prompt_tokens``: False): the engine's buffer then
    leaves ``request_added.prompt_token_ids`` None instead of copying each prompt.
    """

    def open(self, header: dict[str, Any]) -> None: ...

    def on_step_end(self, buffer: EventBuffer) -> None: ...

    def on_idle(self, buffer: EventBuffer) -> None:
        """The engine has no step to take until a later input: a sink may write what it holds
        (the recorder flushes here on its time limit)."""
        ...

    def close(self, buffer: EventBuffer, summary: dict[str, Any]) -> None:
        """The run is over; ``summary["interrupted"]`` True: it was stopped before its end (the
        recorder then commits every event but writes no summary: the trace is incomplete)."""
        ...


class MemorySink:
    """Keeps every event in memory; ``tables`` holds them after ``close`` (or ``snapshot``)."""

    def __init__(self) -> None:
        self.header: dict[str, Any] = {}
        self.summary: dict[str, Any] = {}
        self.tables: dict[str, dict[str, list]] = {
            kind: {col: [] for col in all_columns(kind)} for kind in EVENT_KINDS
        }

    def open(self, header: dict[str, Any]) -> None:
        self.header = header

    def on_step_end(self, buffer: EventBuffer) -> None:
        pass

    def on_idle(self, buffer: EventBuffer) -> None:
        pass

    def snapshot(self, buffer: EventBuffer) -> dict[str, dict[str, list]]:
        """Move what the buffer holds into ``tables`` and return them."""
        for kind, cols in buffer.drain().items():
            mine = self.tables[kind]
            for name, values in cols.items():
                mine[name].extend(values)
        return self.tables

    def close(self, buffer: EventBuffer, summary: dict[str, Any]) -> None:
        self.snapshot(buffer)
        self.summary = summary
