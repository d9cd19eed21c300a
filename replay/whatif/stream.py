"""Streaming simulation: requests read as their arrival comes near, state dropped as they finish.

``simulate_stream(source, overrides, cost)`` runs the same engine as ``run_variant`` (the
engine's own ``Scheduler`` and ``BlockManager`` decide everything, block by block), but:

- requests come from a ``RequestSource``, an iterator in arrival order, pulled one request
  ahead of the simulated clock (nothing holds or sorts the whole workload);
- a prompt stays a ``PromptRecipe`` or an int32 array until the engine takes it;
- when a request finishes, the executor releases its recorded tokens and the engine forgets
  its ``Sequence``;
- the event stream is folded into metrics columns as it goes (``StreamingMetrics``) or also
  written to a Parquet trace in segments (``trace_out``), never held whole.

A request the variant can never serve is rejected by the engine as a live run rejects it,
counted (the summary's ``rejected``) and named in a note, as ``run_variant`` does for a
workload file; a variant that serves none is reported ``cannot run`` with the count.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from engine.config import Config
from engine.drive import drive
from engine.engine_core import EngineCore, StepResult
from engine.errors import ReplayLLMError
from engine.prompt_ids import prompt_token_ids
from replay.stream_metrics import StreamingMetrics
from replay.whatif.cost.model import CostModel
from replay.whatif.notes import never_scheduled, rejected_note, variant_notes
from replay.whatif.sim_executor import SimExecutor
from replay.whatif.simulate import OK, SimRequest, SimResult, build_engine
from replay.workloads.recipe import PromptRecipe, recipe_tokens
from replay.workloads.request import Request

# (The step-time model's coverage check reads every step's features: not kept when streaming.)
STREAM_COVERAGE_NOTE = ("streamed: where this variant's steps leave the timing source's range "
                        "is not checked (run without streaming for the coverage warnings)")
# Requests read ahead of the one due next, to make their recipe prompts' tokens in one batch.
MATERIALISE_AHEAD = 256
# Finished requests between two calls of ``simulate_stream``'s ``progress`` (never each step).
PROGRESS_EVERY = 1000


# The command named in a simulated trace's owner record: ``trace_out`` replaces only those.
TRACE_OUT_WRITER = "whatif"


def trace_out_replaces(path: str | Path) -> bool:
    """Check that a simulated trace may be written at ``path`` (before any work); True where
    it replaces an earlier one. Only a trace an earlier ``trace_out`` wrote is replaced (its
    owner record's command, or a header saying ``simulated_from``): a recording of ``run``,
    ``serve`` or ``LLM``, complete or killed, is measured data no simulation may overwrite;
    anything else is held to the rules of a trace directory (``tracing.recorder``)."""
    import json

    from tracing.outdir import OutputDirError, read_owner
    from tracing.recorder import check_trace_dir

    where = Path(path)
    owner = read_owner(where) if where.is_dir() and not where.is_symlink() else None
    if owner is not None and owner.get("kind") == "trace":
        try:
            header = json.loads((where / "run.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            header = None
        simulated = isinstance(header, dict) and "simulated_from" in header
        command = owner.get("command")
        if command != TRACE_OUT_WRITER and not simulated:
            writer = "LLM (the Python API)" if command == "api" else f"replayllm {command}"
            raise OutputDirError(
                f"{where}: holds a trace recorded by {writer}; "
                "--trace-out replaces only a simulated trace it wrote earlier: choose another "
                "directory")
        return check_trace_dir(where, overwrite=True)
    return check_trace_dir(where, overwrite=False)


class RequestSource(Protocol):
    """Requests to simulate, in arrival order, and the settings of the run they came from."""

    name: str
    config: Config
    header: dict[str, Any]
    start_s: float  # when the simulated clock starts

    def __iter__(self) -> Iterator[SimRequest]: ...


def prompt_ids(prompt: Any) -> array | list[int]:
    """A prompt (token ids, a numpy array or a recipe) as the engine takes it: an int32
    ``array('i')``, or the list of ints where a value does not fit int32 (the engine then
    refuses it with its own message): ``engine.prompt_ids.prompt_token_ids``."""
    if isinstance(prompt, PromptRecipe):
        prompt = prompt.tokens()
    return prompt_token_ids(prompt)[0]


def sim_request(request: Request, where: str) -> SimRequest:
    """A workload request as the simulator takes it (its recipe or token ids kept compact)."""
    if request.follows_previous_turn:
        raise ReplayLLMError(f"{where}: a later conversation turn: the streaming simulator takes "
                             "independent requests (simulate conversations without --stream)")
    prompt = request.prompt
    if isinstance(prompt, str):
        raise ReplayLLMError(f"{where}: a text prompt; the simulator needs token ids "
                             "(prompt_token_ids or a recipe)")
    if not isinstance(prompt, PromptRecipe):
        prompt = np.asarray(prompt, dtype=np.int32)
    return SimRequest(prompt, request.sampling_params(), request.arrival_s, 0,
                      priority=request.priority)


@dataclass
class WorkloadSource:
    """A workload's requests (an iterable of ``Request``, e.g. ``read_workload(path)``)."""

    requests: Iterable[Request]
    config: Config
    name: str = "workload"
    start_s: float = 0.0

    @property
    def header(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "workload": self.name}

    def __iter__(self) -> Iterator[SimRequest]:
        batch: list[SimRequest] = []
        for number, request in enumerate(self.requests):
            batch.append(sim_request(request, f"{self.name}: request {number}"))
            if len(batch) == MATERIALISE_AHEAD:
                yield from materialised(batch)
                batch = []
        yield from materialised(batch)


def materialised(batch: list[SimRequest]) -> list[SimRequest]:
    """``batch`` with its recipe prompts turned into token arrays, all in one numpy pass."""
    recipes = [r for r in batch if isinstance(r.prompt, PromptRecipe)]
    for request, tokens in zip(recipes, recipe_tokens([r.prompt for r in recipes])):
        request.prompt = tokens
    return batch


def workload_file_source(path: str | Path, config: Config) -> WorkloadSource:
    """A workload file (JSONL or Parquet), read as the simulation goes."""
    from replay.workloads.store import read_workload

    return WorkloadSource(read_workload(path), config, name=str(path))


class StreamInputs:
    """The engine's inputs (``engine.drive.Inputs``) from a request iterator, one ahead.

    Timed: a request is due at its ``arrival_s``; untimed (no step-time model): at once (there
    is no clock to wait on, so every request joins at the start, as with ``run_variant``).
    Finished requests are released from the executor and the engine as each step returns,
    and counted (``finished``, rejected ones included): ``progress(finished)`` is called each
    ``PROGRESS_EVERY`` of them.
    """

    def __init__(self, core: EngineCore, requests: Iterator[SimRequest], executor: SimExecutor,
                 timed: bool, name: str,
                 progress: Callable[[int], None] | None = None) -> None:
        self.core, self.requests, self.executor = core, requests, executor
        self.timed, self.name = timed, name
        self.added = 0
        self.finished = 0
        self.progress = progress
        self._report_at = PROGRESS_EVERY if progress is not None else float("inf")
        self.cannot_serve = 0
        self.first_problem = ""
        self._last_due = -np.inf
        self._next: SimRequest | None = next(self.requests, None)
        if executor.prices_stretches:  # decode steps in stretches up to the next arrival
            core.decode_horizon = self.horizon

    def horizon(self) -> float:
        """When the next request is due on the engine's clock (inf: none is left; -inf: one
        is due at a step of an untimed run, which has no clock to run a stretch up to)."""
        if self._next is None:
            return float("inf")
        return self._next.arrival_s if self.timed else -float("inf")

    def _due(self, request: SimRequest) -> float:
        return request.arrival_s if self.timed else 0.0

    def feed(self, core: EngineCore, now: float) -> None:
        request = self._next
        while request is not None and self._due(request) <= now:
            self._add(core, request)
            request = self._next = next(self.requests, None)
            if request is not None and self._due(request) < self._last_due:
                raise ReplayLLMError(
                    f"{self.name}: request {self.added} arrives at {request.arrival_s} s, before "
                    f"the one before it ({self._last_due} s): a streamed workload must come in "
                    "arrival order")

    def _add(self, core: EngineCore, request: SimRequest) -> None:
        self._last_due = self._due(request)
        prompt = prompt_ids(request.prompt)
        seq = core.add_request(prompt, request.params, arrival_s=request.arrival_s,
                               error=request.precheck_error, priority=request.priority)
        self.executor.bind(seq.seq_id, request.tokens)
        self.executor.admit(len(prompt), request.arrival_s)
        reason = core.rejections.get(seq.seq_id)
        if reason is not None and request.precheck_error is None and \
                not request.rejected_in_source:
            self.cannot_serve += 1
            if not self.first_problem:
                self.first_problem = f"request {self.added}: {reason}"
        if seq.is_finished:  # rejected
            self._release(seq.seq_id)
            self._count(1)
        self.added += 1

    def next_due(self) -> float | None:
        return self._due(self._next) if self._next is not None else None

    def on_result(self, result: StepResult, now: float) -> None:
        finished = result.finished
        if finished:
            for seq in finished:
                self._release(seq.seq_id)
            self._count(len(finished))

    def _count(self, finished: int) -> None:
        self.finished += finished
        if self.finished >= self._report_at and self.progress is not None:
            self._report_at = self.finished + PROGRESS_EVERY
            self.progress(self.finished)

    def _release(self, seq_id: int) -> None:
        self.executor.release(seq_id)
        self.core.forget(seq_id)


def _drive(core: EngineCore, inputs: StreamInputs, start_s: float, timed: bool) -> None:
    """Step until every request is in and done (the clock as ``simulate._run_workload``)."""
    clock = core.clock
    if timed:
        clock.now = start_s  # type: ignore[attr-defined]

    def now() -> float:
        return clock.now if timed else core.step_index  # type: ignore[attr-defined]

    def wait_until(due: float) -> None:
        if timed:
            clock.now = max(clock.now, due)  # type: ignore[attr-defined]

    drive(core, inputs, now, wait_until)


def simulate_stream(
    source: RequestSource,
    overrides: dict[str, Any] | None = None,
    cost: CostModel | None = None,
    name: str = "",
    trace_out: str | Path | None = None,
    downstream: Any = None,
    cold_start: bool | None = None,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Simulate ``source`` under its Config with ``overrides``, in memory bounded by the
    requests in flight (see the module docstring). ``trace_out``: also write the simulated
    event stream there as a trace, in segments; ``downstream``: another sink to hand every
    event to (a ``tracing.sink.MemorySink`` in tests); ``progress(finished)``: told the count of
    requests finished every ``PROGRESS_EVERY`` of them and once at the end (a progress bar).
    Never raises for a variant that cannot run (status says why); a source out of arrival order
    raises ``ReplayLLMError``."""
    began = time.perf_counter()
    overrides = dict(overrides or {})
    name = name or " ".join(f"{k}={v}" for k, v in overrides.items()) or "as recorded"
    timed = cost is not None
    if trace_out is not None:
        from tracing.recorder import ParquetRecorder

        downstream = ParquetRecorder(trace_out, overwrite=trace_out_replaces(trace_out),
                                     command=TRACE_OUT_WRITER)
    metrics = StreamingMetrics(downstream=downstream)
    built = build_engine(source.config, source.header, source.name, overrides, cost,
                         cold_start, sink=metrics)
    if isinstance(built, str):
        return SimResult(name, overrides, built, timed)
    config, executor, core = built
    inputs = StreamInputs(core, iter(source), executor, timed, source.name, progress)
    _drive(core, inputs, source.start_s, timed)
    core.close()
    if progress is not None:
        progress(inputs.finished)
    if inputs.cannot_serve and inputs.cannot_serve >= inputs.added:  # none served
        return SimResult(name, overrides, never_scheduled(
            inputs.cannot_serve, inputs.added, inputs.first_problem), timed)
    run = metrics.result(timed)
    notes = variant_notes(source.config, config, cost, executor)
    if inputs.cannot_serve:
        notes.append(rejected_note(inputs.cannot_serve, inputs.added, inputs.first_problem))
    if cost is not None:
        notes.append(STREAM_COVERAGE_NOTE)
    return SimResult(name, overrides, OK, timed, run.summary, run.requests, run.steps, None,
                     notes, time.perf_counter() - began, inputs.cannot_serve)
