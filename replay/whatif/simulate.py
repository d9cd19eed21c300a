"""What-if simulation: re-run a recorded workload under another Config, predicting its times.

``simulate(source, overrides, timing=...)`` takes the source's requests (prompts, sampling
settings, arrival times) and, per request, the tokens it sampled, and drives them through the
engine's own ``EngineCore`` / ``Scheduler`` / ``BlockManager`` under the overridden Config. The
executor is ``SimExecutor``: recorded tokens by sequence position, a clock advanced by the
step-time model. Nothing here decides anything the scheduler decides.

Arrivals: with a step-time model, a request joins once the simulated clock passes its arrival
time (as ``replay.cli.live`` does on a real clock), and adding it takes the loop's host time
(``SimExecutor.admit``); the requests the source added before its first step are added in one go,
the clock starting at the first of them. Without a model there is no clock, and a request joins
at the step the recording added it (or at once, when the engine would otherwise idle). Aborts
come at their recorded times (or steps); a request the source ended at a stop string ends after
the same token, whenever that comes (``replay.whatif.sim_inputs``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.config import AUTO_SIZED_BLOCKS, Config
from engine.drive import drive
from engine.engine_core import EngineCore
from engine.errors import ConfigError
from engine.graph_sizes import mixed_graph_decode_sizes, prefill_graph_limit, prefill_graph_prompts
from engine.policy_guard import PolicyError
from engine.sequence import Sequence
from replay.metrics import compute
from replay.recorded import RecordedEvents, from_columns, from_trace
from replay.whatif.cost.model import CostModel
from replay.whatif.notes import (
    CANNOT_RUN,
    UNSIMULATED_FIELDS,
    never_scheduled,
    rejected_note,
    variant_notes,
)
from replay.whatif.sim_executor import SimClock, SimExecutor
from replay.whatif.sim_inputs import RecordedInputs
from replay.whatif.source import (
    SimRequest,
    SimWorkload,
    load_source,
    workload_from_recorded,
    workload_from_requests,
)
from replay.whatif.worker_signals import install_worker_handler, interruptible, stop_pool
from replay.workloads.inputs import WorkloadInputs
from tracing.sink import EventSink

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "UNSIMULATED_FIELDS",
    "SimRequest",
    "SimResult",
    "SimWorkload",
    "load_source",
    "load_timing",
    "run_variant",
    "simulate",
    "simulate_many",
    "workload_from_recorded",
    "workload_from_requests",
]

OK = "ok"


@dataclass
class SimResult:
    """One variant's prediction: its status, metrics and (if kept) its event stream."""

    name: str
    overrides: dict[str, Any]
    status: str
    timed: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    requests: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    events: RecordedEvents | None = None
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    # Requests this variant's engine rejected that its source did not (a workload file's
    # requests it can never serve, rejected as a live run rejects them): not served.
    newly_rejected: int = 0

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def summary(self) -> dict[str, float]:
        """The metrics (same name as ``RunMetrics.summary``, so plots take either)."""
        return self.metrics


def load_timing(timing: Any, workload: SimWorkload) -> tuple[CostModel | None, list[str]]:
    """The step-time model: a CostModel, a saved model (.json), a trace to fit, ``"auto"``
    (fit from the source when it has measured times) or None (no times)."""
    if timing is None or timing is False:
        return None, []
    if isinstance(timing, CostModel):
        return timing, []
    if timing == "auto":
        if workload.timed_source:
            assert workload.recorded is not None
            return CostModel.fit(workload.recorded, source=workload.name), []
        return None, [
            f"{workload.name} has no measured step times: decisions only; "
            "pass --timing-from TRACE to predict times"
        ]
    path = Path(timing)
    if path.suffix == ".json":
        return CostModel.load(path), []
    from tracing.reader import read_trace

    return CostModel.fit(from_trace(read_trace(path)), source=str(path)), []


# --- one variant --------------------------------------------------------------------------------
def _admission_problems(core: EngineCore, workload: SimWorkload) -> str | None:
    """Why the variant cannot serve a request a recording served (None: it can serve all).

    A workload file's requests have no recording to match: the engine rejects those it cannot
    serve as a live run does (``rejected_note``), so none is refused here."""
    if workload.workload is not None:
        return None
    bad = [
        (i, error)
        for i, r in enumerate(workload.requests)
        if not r.rejected_in_source
        and (error := core.scheduler.admission_error(Sequence(i, r.prompt, r.params)))
    ]
    if not bad:
        return None
    index, error = bad[0]
    return never_scheduled(len(bad), len(workload.requests), f"request {index}: {error}")


def _workload_rejections(core: EngineCore, inputs: Any) -> tuple[int, str]:
    """(how many of a workload file's requests the engine rejected, the first one and why)."""
    rejected = sorted((inputs.index_of[seq_id], reason)
                      for seq_id, reason in core.rejections.items())
    if not rejected:
        return 0, ""
    index, reason = rejected[0]
    return len(rejected), f"request {index}: {reason}"


def _run_workload(core: EngineCore, executor: SimExecutor, workload: SimWorkload,
                  timed: bool, host_lags: bool = False) -> RecordedInputs | WorkloadInputs:
    """Feed requests and aborts at their times (or steps) and step until everything is done.

    Timed: the simulated clock starts at the first request the source added before its first
    step, those requests are all added before that step (as recorded), and the clock jumps to
    the next arrival when the engine idles. Untimed: inputs join at the step the source added
    them, or at once when the engine would otherwise idle.

    ``host_lags``: the live engine overlaps steps on an asynchronous device, so after a step it
    deferred, its loop takes in arrivals when the step before finished (it returns from
    ``EngineCore.step`` with that step's result while the deferred one still runs), not when the
    deferred one finishes: an arrival joins a step later than a sequential loop would take it."""
    clock = executor.clock
    floor = [-np.inf]  # untimed: inputs due up to here join even if the step index lags behind
    if timed:
        clock.now = workload.start_s if workload.first_s is None else workload.first_s

    def now() -> float:
        if not timed:
            return max(core.step_index, floor[0])
        if host_lags and core.last_step_deferred:
            return clock.now - executor.last_interval_s
        # Before the first step: every request the source added before it is due.
        return clock.now if core.step_index else max(clock.now, workload.start_s)

    def wait_until(due: float) -> None:
        if timed:
            clock.now = max(clock.now, due)
        else:
            floor[0] = due

    inputs = (RecordedInputs(executor, workload, timed) if workload.workload is None
              else _workload_file_inputs(core, executor, workload, timed))
    drive(core, inputs, now, wait_until)
    return inputs


def _host_lags(workload: SimWorkload, config: Config) -> bool:
    """Whether the live loop takes arrivals a step late after a deferred step: overlapped
    scheduling on an asynchronous device (CUDA; a CPU step completes inside its launch)."""
    device = str(workload.header.get("device") or "")
    return config.async_scheduling and device.startswith("cuda")


def _workload_file_inputs(core: EngineCore, executor: SimExecutor, workload: SimWorkload,
                          timed: bool) -> WorkloadInputs:
    """A workload's requests (no recording) through ``WorkloadInputs``, as a live run feeds
    them: a conversation's later turn goes out once its simulated previous turn finished."""
    requests = workload.requests

    def submit(index: int, prompt: list[int] | str, due: float) -> Sequence:
        seq = core.add_request(prompt, requests[index].params, arrival_s=due,  # type: ignore
                               priority=requests[index].priority)
        executor.bind(seq.seq_id, requests[index].tokens)
        executor.admit(len(prompt), due)
        return seq

    assert workload.workload is not None
    return WorkloadInputs(workload.workload, submit, timed)


def build_engine(
    source_config: Config,
    source_header: dict[str, Any],
    source_name: str,
    overrides: dict[str, Any],
    cost: CostModel | None,
    cold_start: bool | None = None,
    sink: EventSink | None = None,
) -> tuple[Config, SimExecutor, EngineCore] | str:
    """The simulated engine of one variant (its Config, executor and core, recording to
    ``sink`` if given), or why the variant cannot run."""
    try:
        config = source_config.replace(**overrides)
    except ConfigError as exc:
        return f"{CANNOT_RUN}: {exc}"
    if config.num_kvcache_blocks == AUTO_SIZED_BLOCKS:
        return (f"{CANNOT_RUN}: the KV pool size is unknown (num_kvcache_blocks=-1); "
                "set num_kvcache_blocks")
    clock = SimClock(0.0)
    use_graphs = not config.enforce_eager
    executor = SimExecutor(config.num_kvcache_blocks, clock, cost, use_graphs, eos=config.eos,
                           prefill_graph_tokens=prefill_graph_limit(config),
                           prefill_graph_seqs=prefill_graph_prompts(config),
                           one_off_costs=cold_start is not False,
                           mixed_decode_sizes=mixed_graph_decode_sizes(config),
                           block_size=config.kvcache_block_size)
    header = {k: v for k, v in source_header.items() if k not in ("executor", "config")}
    header["simulated_from"] = source_name
    core = EngineCore(config, executor, sink=sink, header=header, clock=clock)
    return config, executor, core


def run_variant(
    workload: SimWorkload,
    overrides: dict[str, Any],
    cost: CostModel | None,
    name: str = "",
    keep_events: bool = True,
    cold_start: bool | None = None,
) -> SimResult:
    """Simulate ``workload`` under its Config with ``overrides``; never raises for a variant
    that cannot run (status says why).

    ``cold_start``: whether the run starts in a fresh process and pays the source's one-off
    first-step costs (kernel compilation); None: as the source did (``cold_start_of``)."""
    began = time.perf_counter()
    name = name or format_overrides(overrides)
    timed = cost is not None
    try:  # a user policy that cannot be built, or fails mid-run, fails its variant only
        built = build_engine(workload.config, workload.header, workload.name, overrides, cost,
                             cold_start)
        if isinstance(built, str):
            return SimResult(name, overrides, built, timed)
        config, executor, core = built
        problem = _admission_problems(core, workload)
        if problem is not None:
            return SimResult(name, overrides, problem, timed)
        inputs = _run_workload(core, executor, workload, timed,
                               host_lags=_host_lags(workload, config))
    except PolicyError as exc:
        return SimResult(name, overrides, f"{CANNOT_RUN}: {exc}", timed)
    core.close()
    rejected, first = (_workload_rejections(core, inputs)
                       if workload.workload is not None else (0, ""))
    total = len(workload.requests)
    if rejected and rejected + getattr(inputs, "skipped_turns", 0) >= total:  # none served
        return SimResult(name, overrides, never_scheduled(rejected, total, first), timed)
    if keep_events:
        events = from_columns(core.header, core.events.tables)
    else:
        # Metrics read only a few columns: leave the rest as the engine's lists, unconverted.
        events = RecordedEvents(core.header, core.events.tables, core.step_index - 1)
    scope = workload.scope  # an incomplete source's finished requests: metrics cover them only
    run = compute(events if scope is None else scope.restrict(events), timed=timed)
    notes = variant_notes(workload.config, config, cost, executor)
    if rejected:
        notes.append(rejected_note(rejected, total, first))
    if cost is not None:
        notes += cost.coverage_warnings(events)  # where this variant leaves the source's range
    return SimResult(
        name, overrides, OK, timed, run.summary, run.requests, run.steps,
        events if keep_events else None, notes, time.perf_counter() - began, rejected,
    )


def simulate(
    source: Any,
    overrides: dict[str, Any] | None = None,
    timing: Any = "auto",
    name: str = "",
    keep_events: bool = True,
) -> SimResult:
    """Predict the source's run under its Config with ``overrides``.

    ``source``: a trace directory, a trace from ``read_trace``, ``RecordedEvents`` or a
    ``SimWorkload``. ``timing``: ``"auto"`` (fit a step-time model from the source when it has
    measured times), a ``CostModel``, a saved model (``.json``), another trace to fit, or None.
    ``keep_events``: keep the simulated event stream in ``result.events`` (for comparisons).
    """
    workload = load_source(source)
    cost, notes = load_timing(timing, workload)
    result = run_variant(workload, dict(overrides or {}), cost, name, keep_events)
    result.notes = notes + result.notes
    return result


def cold_start_of(header: dict[str, Any]) -> bool | None:
    """Whether a recording started in a fresh process (its first steps may compile kernels); None:
    its header predates ``engine_starts_before``. A prediction compared with that recording
    should start the same way."""
    starts = header.get("engine_starts_before")
    return None if starts is None else int(starts) == 0


def format_overrides(overrides: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in overrides.items()) or "as recorded"


# --- many variants ------------------------------------------------------------------------------
_SHARED: dict[str, Any] = {}


def _worker(item: tuple[str, dict[str, Any]]) -> SimResult:
    name, overrides = item
    with interruptible():  # Ctrl-C never cuts the result's send (worker_signals)
        return run_variant(_SHARED["workload"], overrides, _SHARED["cost"], name,
                           keep_events=False)


def simulate_many(
    workload: SimWorkload,
    variants: list[tuple[str, dict[str, Any]]],
    cost: CostModel | None,
    jobs: int | None = None,
    progress: Any = None,
) -> list[SimResult]:
    """Run ``(name, overrides)`` variants, in parallel processes across cores when there are
    several. Results keep the input order; event streams are not kept (only metrics)."""
    jobs = min(jobs or os.cpu_count() or 1, len(variants))
    if jobs <= 1:
        results = []
        for name, overrides in variants:
            results.append(run_variant(workload, overrides, cost, name, keep_events=False))
            if progress is not None:
                progress()
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # Workers inherit the workload by fork (no pickling of a 100k-token workload per task).
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    _SHARED.update(workload=workload, cost=cost)
    out: list[SimResult | None] = [None] * len(variants)
    try:
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker,
                                 initargs=(None if context.get_start_method() == "fork"
                                           else (workload, cost),)) as pool:
            try:
                futures = {pool.submit(_worker, item): i for i, item in enumerate(variants)}
                for future in as_completed(futures):
                    out[futures[future]] = future.result()
                    if progress is not None:
                        progress()
            except BaseException:  # Ctrl-C: no variant left running, nothing waited on
                stop_pool(pool)
                raise
    finally:
        _SHARED.clear()
    return [r for r in out if r is not None]


def _init_worker(shared: tuple[SimWorkload, CostModel | None] | None) -> None:
    install_worker_handler()
    if shared is not None:
        _SHARED.update(workload=shared[0], cost=shared[1])
