"""Run metrics folded from the event stream as it happens, in bounded memory.

``StreamingMetrics`` is an ``EventSink``: every few thousand events it folds the engine's buffer
into compact numpy columns (per request: arrival, prompt length, first and last token step,
token count, first scheduled step, preemptions, finish reason; per step: its end time, batch
size, free blocks) and drains the buffer, so the event stream is never held whole. ``result``
then gives exactly what ``replay.metrics.compute`` gives on the whole stream: both build the
same per-request and per-step tables and share ``summarize``.

Per-request columns are indexed by ``seq_id``: the engine hands ids out 0, 1, 2, ... in the
order it adds requests, which is the order of ``request_added`` rows that ``compute`` keeps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replay.metrics import (
    RunMetrics,
    RunTotals,
    pool_of,
    queue_times,
    request_frame,
    step_ends_before,
    step_frame,
    step_rows,
    summarize,
)
from tracing.events import EventBuffer
from tracing.sink import EventSink

FOLD_EVENTS = 1 << 16  # token_sampled rows buffered before a fold
FOLD_REQUESTS = 256  # or request_added rows, when stretches sample (each may hold its prompt)
FOLD_STRETCHES = 64  # decode stretches' counts held before they are folded together
NOT_YET = -1  # a step column of a request that has not reached that point
STEP_KINDS = ("prefill", "decode", "mixed")


_NEVER = np.iinfo(np.int64).max


def _ints(values: list) -> np.ndarray:
    return np.fromiter(values, np.int64, len(values))


def _keep_earliest(mine: np.ndarray, first: np.ndarray) -> None:
    """Set each of ``mine`` (``NOT_YET`` where unknown) to ``first`` where that is earlier
    (``_NEVER``: no row): any order of folds gives the earliest step."""
    update = (first != _NEVER) & ((mine == NOT_YET) | (first < mine))
    mine[update] = first[update]


def _first_steps(seq: np.ndarray, step: np.ndarray, size: int) -> np.ndarray:
    """Each of ``size`` requests' first step in these rows (``_NEVER`` where absent): steps
    never decrease along the stream, so the first is the least."""
    first = np.full(size, _NEVER, dtype=np.int64)
    np.minimum.at(first, seq, step)
    return first


class _Column:
    """A growable numpy column (amortised doubling)."""

    __slots__ = ("data", "size", "fill")

    def __init__(self, dtype: Any, fill: Any = 0) -> None:
        self.data = np.full(1024, fill, dtype=dtype)
        self.size = 0
        self.fill = fill

    def reserve(self, size: int) -> np.ndarray:
        """The backing array, grown to hold at least ``size`` rows (new rows hold ``fill``)."""
        if size > len(self.data):
            grown = np.full(max(size, 2 * len(self.data)), self.fill, dtype=self.data.dtype)
            grown[: len(self.data)] = self.data
            self.data = grown
        self.size = max(self.size, size)
        return self.data

    def extend(self, values: Any) -> None:
        values = np.asarray(values, dtype=self.data.dtype)
        start = self.size
        self.reserve(start + len(values))[start : start + len(values)] = values

    def view(self) -> np.ndarray:
        return self.data[: self.size]


class StreamingMetrics:
    """An ``EventSink`` that keeps a run's metrics, not its events (see the module docstring).

    ``downstream`` (optional): a sink that gets every event too (a ``ParquetRecorder`` writing
    the trace in segments): the buffer is then folded at every step end and its events handed
    on in a buffer of their own, which the downstream sink drains as it would the engine's.
    """

    def __init__(self, fold_events: int = FOLD_EVENTS, downstream: EventSink | None = None) -> None:
        self.fold_events = fold_events
        self.downstream = downstream
        self._relay = EventBuffer()
        self.header: dict[str, Any] = {}
        self.summary: dict[str, Any] = {}
        self.arrival = _Column(np.float64, np.nan)
        self.prompt_len = _Column(np.int32)
        self.first_step = _Column(np.int64, NOT_YET)  # of the first sampled token
        self.last_step = _Column(np.int64, NOT_YET)
        self.tokens = _Column(np.int32)
        self.scheduled_step = _Column(np.int64, NOT_YET)  # the first step that scheduled it
        self.preempted = _Column(np.int32)
        self.reason = _Column(np.int8)
        self.steps = _Column(np.int64)
        self.kind = _Column(np.int8)
        self.time_s = _Column(np.float64)
        self.duration_s = _Column(np.float64)
        self.num_seqs = _Column(np.int32)
        self.batched_tokens = _Column(np.int64)
        self.free_blocks = _Column(np.int32)
        self._reasons: list[str] = [""]  # finish reasons by code ("": not finished)
        self.num_requests = 0
        self.num_batches = 0
        self.preemptions = 0
        self.block_hits = 0
        self.prefill_tokens = 0
        # Decode stretches' counts not folded yet: (seq ids, first step, tokens sampled each).
        self._stretches: list[tuple[np.ndarray, int, np.ndarray]] = []

    # --- EventSink --------------------------------------------------------------------------------
    def open(self, header: dict[str, Any]) -> None:
        self.header = header
        if self.downstream is not None:
            self.downstream.open(header)

    def on_step_end(self, buffer: EventBuffer) -> None:
        if self.downstream is not None:
            self.fold(buffer)
            self.downstream.on_step_end(self._relay)
        elif len(buffer.tables["token_sampled"]["seq_id"]) >= self.fold_events or \
                len(buffer.tables["request_added"]["seq_id"]) >= FOLD_REQUESTS:
            self.fold(buffer)

    @property
    def takes_decode_stretches(self) -> bool:
        """Whether a decode stretch may hand this sink ``add_decode_stretch``'s counts instead
        of its ``seq_scheduled`` and ``token_sampled`` rows: no downstream sink needs them."""
        return self.downstream is None

    @property
    def needs_prompt_tokens(self) -> bool:
        """Whether the ``request_added`` rows must hold their prompts: only for a downstream
        sink (these columns keep prompt lengths only)."""
        return self.downstream is not None

    def add_decode_stretch(self, seq_ids: np.ndarray, first_step: int,
                           sampled: np.ndarray) -> None:
        """Fold what a decode stretch's ``seq_scheduled`` and ``token_sampled`` rows hold
        (``engine.decode_stretch``): sequence ``seq_ids[i]`` (each once) was scheduled and
        sampled a token at each of the ``sampled[i]`` steps from ``first_step`` on. Held and
        folded ``FOLD_STRETCHES`` stretches at a time (the folds are order-free: earliest step,
        latest step, sums), and at every ``fold``; ``seq_ids`` must not change meanwhile."""
        self._stretches.append((seq_ids, first_step, sampled))
        if len(self._stretches) >= FOLD_STRETCHES:
            self._fold_stretches()

    def _fold_stretches(self) -> None:
        """Fold the held stretches' counts into the per-request columns, all at once."""
        held, self._stretches = self._stretches, []
        if not held:
            return
        seq_ids = np.concatenate([ids for ids, _, _ in held])
        sizes = [len(ids) for ids, _, _ in held]
        first = np.repeat(np.array([step for _, step, _ in held], np.int64), sizes)
        sampled = np.concatenate([counts for _, _, counts in held])
        lo, hi = int(seq_ids.min()), int(seq_ids.max()) + 1  # the requests in flight, a window
        for column in (self.first_step, self.last_step, self.tokens, self.scheduled_step):
            column.reserve(hi)
        seq = seq_ids - lo
        earliest = _first_steps(seq, first, hi - lo)
        _keep_earliest(self.first_step.data[lo:hi], earliest)
        _keep_earliest(self.scheduled_step.data[lo:hi], earliest)
        np.maximum.at(self.last_step.data[lo:hi], seq, sampled + (first - 1))
        np.add.at(self.tokens.data[lo:hi], seq, sampled.astype(np.int32))

    def close(self, buffer: EventBuffer, summary: dict[str, Any]) -> None:
        self.fold(buffer)
        self.summary = summary
        if self.downstream is not None:
            self.downstream.close(self._relay, summary)

    # --- folding ----------------------------------------------------------------------------------
    def fold(self, buffer: EventBuffer) -> None:
        """Fold everything buffered into the columns and drain the buffer (into the relay
        buffer of a downstream sink, if any)."""
        tables = buffer.drain()
        self._fold_stretches()
        self._fold(tables)
        if self.downstream is not None:
            relay = self._relay
            relay.step = buffer.step
            relay.next_event_id = buffer.next_event_id
            for kind, columns in tables.items():
                mine = relay.tables[kind]
                for name, values in columns.items():
                    mine[name].extend(values)

    def _fold(self, tables: dict[str, dict[str, list]]) -> None:
        ra = tables["request_added"]
        if ra["seq_id"]:
            ids = np.asarray(ra["seq_id"], dtype=np.int64)
            if ids[0] != self.num_requests or ids[-1] - ids[0] != len(ids) - 1:
                raise ValueError("request ids must come 0, 1, 2, ... in the order added")
            self.num_requests += len(ids)
            for column in (self.first_step, self.last_step, self.tokens, self.scheduled_step,
                           self.preempted, self.reason):
                column.reserve(self.num_requests)
            self.arrival.extend(ra["arrival_s"])
            self.prompt_len.extend(ra["prompt_len"])
        ts = tables["token_sampled"]
        if ts["seq_id"]:
            seq = _ints(ts["seq_id"])
            lo, hi = int(seq.min()), int(seq.max()) + 1  # the requests in flight, a window
            seq -= lo
            steps = _ints(ts["step"])
            _keep_earliest(self.first_step.data[lo:hi], _first_steps(seq, steps, hi - lo))
            np.maximum.at(self.last_step.data[lo:hi], seq, steps)
            self.tokens.data[lo:hi] += np.bincount(seq, minlength=hi - lo).astype(np.int32)
        ss = tables["seq_scheduled"]
        if ss["seq_id"]:
            seq = _ints(ss["seq_id"])
            lo, hi = int(seq.min()), int(seq.max()) + 1
            _keep_earliest(self.scheduled_step.data[lo:hi],
                           _first_steps(seq - lo, _ints(ss["step"]), hi - lo))
        pe = tables["preempted"]["seq_id"]
        if pe:
            unique, counts = np.unique(np.asarray(pe, dtype=np.int64), return_counts=True)
            self.preempted.data[unique] += counts.astype(np.int32)
            self.preemptions += len(pe)
        rf = tables["request_finished"]
        if rf["seq_id"]:
            codes = np.fromiter((self._reason_code(r) for r in rf["reason"]), np.int8,
                                len(rf["reason"]))
            self.reason.data[np.asarray(rf["seq_id"], dtype=np.int64)] = codes
        self.block_hits += len(tables["block_hit"]["seq_id"])
        ms = tables["model_step"]
        if ms["step"]:
            self.steps.extend(ms["step"])
            self.kind.extend([STEP_KINDS.index(k) for k in ms["kind"]])
            self.time_s.extend(ms["wall_time_s"])
            self.duration_s.extend(ms["duration_s"])
            self.num_seqs.extend(ms["num_seqs"])
            self.prefill_tokens += sum(ms["prefill_tokens"])
        bs = tables["batch_scheduled"]
        if bs["free_blocks"]:
            self.batched_tokens.extend(bs["num_batched_tokens"])
            self.free_blocks.extend(bs["free_blocks"])

    def _reason_code(self, reason: str) -> int:
        try:
            return self._reasons.index(reason)
        except ValueError:
            self._reasons.append(reason)
            return len(self._reasons) - 1

    # --- the result -------------------------------------------------------------------------------
    def result(self, timed: bool) -> RunMetrics:
        """The run's metrics, equal to ``replay.metrics.compute`` on its whole event stream."""
        import pandas as pd

        num_blocks, block_size = pool_of(self.header)
        steps = self.steps.view()
        end = self.time_s.view() if timed else np.full(len(steps), np.nan)
        per_step = step_frame(
            steps,
            pd.Categorical.from_codes(self.kind.view(), STEP_KINDS),
            self.time_s.view(),
            self.duration_s.view(),
            self.num_seqs.view().astype(np.int64),
            self.batched_tokens.view(),
            self.free_blocks.view().astype(np.int64),
            num_blocks,
        )
        n = self.num_requests
        arrival = self.arrival.view()
        first, last = self.first_step.data[:n], self.last_step.data[:n]
        sampled = first != NOT_YET
        first_time = np.full(n, np.nan)
        last_time = np.full(n, np.nan)
        if len(steps):
            first_time[sampled] = end[step_rows(steps, first[sampled])]
            last_time[sampled] = end[step_rows(steps, last[sampled])]
        queue = np.full(n, np.nan)
        scheduled_step = self.scheduled_step.data[:n]
        scheduled = scheduled_step != NOT_YET
        if len(steps):
            row = step_rows(steps, scheduled_step[scheduled])
            queue[scheduled] = queue_times(step_ends_before(end, row), arrival[scheduled])
        reason = np.asarray(self._reasons, dtype=object)[self.reason.data[:n]]
        per_request = request_frame(
            np.arange(n, dtype=np.int64), arrival, self.prompt_len.view().astype(np.int64),
            self.tokens.data[:n].astype(np.int64), first_time, last_time, queue,
            self.preempted.data[:n].astype(np.int64), reason,
        )
        totals = RunTotals(num_blocks, block_size, self.preemptions, self.block_hits,
                           self.prefill_tokens)
        return summarize(per_request, per_step, end, totals, timed)

