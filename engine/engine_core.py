"""The step loop shared by every driver: live (a model), replay (a trace), simulate (a cost model).

``EngineCore`` owns the event buffer, the scheduler and an executor. One ``step`` schedules a
batch, executes it, records the model step and post-processes the sampled tokens.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.batch import ScheduledBatch, StepOutput, StepResult, batch_features
from engine.config import AUTO_SIZED_BLOCKS, Config
from engine.decode_stretch import DecodeStretch
from engine.executor import Executor, PendingStep
from engine.in_flight import InFlight
from engine.outside_time import OutsideTime
from engine.overlap_scheduler import OverlapScheduler
from engine.policy import no_progress_error, policy_source
from engine.prompt_ids import int32_ids
from engine.running_columns import RunningColumns
from engine.sampling_params import SamplingParams, check_arrival, check_recordable
from engine.sequence import Sequence
from engine.step_cut import StepCut
from tracing.events import EventBuffer, NullEventBuffer
from tracing.sink import EventSink


class EngineCore:
    """Scheduler + executor + event buffer, stepping in lock-step. ``clock`` supplies wall time
    for measurements only (never for decisions); the simulator passes a simulated clock."""

    def __init__(
        self,
        config: Config,
        executor: Executor,
        sink: EventSink | None = None,
        header: dict[str, Any] | None = None,
        record_events: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if config.num_kvcache_blocks == AUTO_SIZED_BLOCKS:
            config = config.replace(num_kvcache_blocks=executor.num_kvcache_blocks)
        self.config = config
        self.executor = executor
        self.events: EventBuffer = EventBuffer() if record_events else NullEventBuffer()
        self.events.keep_prompt_tokens = getattr(sink, "needs_prompt_tokens", True)
        self.scheduler = OverlapScheduler(config, config.num_kvcache_blocks, self.events)
        self.sink = sink
        self.clock = clock
        self.start_time = clock()
        self.outside = OutsideTime(clock)  # the driver's time between steps (``outside_s``)
        self.step_index = 0
        self.next_seq_id = 0
        self.sequences: dict[int, Sequence] = {}
        self.rejections: dict[int, str] = {}
        self._forgotten_rejections = 0  # rejections dropped by ``forget``, still counted
        self.num_completion_tokens = 0
        self.closed = False
        self._async = bool(getattr(executor, "supports_overlap", False)) and config.async_scheduling
        self._in_flight: InFlight | None = None
        self._cut = StepCut()  # the steps being taken: still marked if one raised
        self._deferred_last = False  # the last scheduled step was post-processed before its tokens
        self._ready: deque[StepResult] = deque()
        self._sink_s = 0.0  # the sink's time at the last step end, charged to the next step
        # Set by a driver whose executor prices decode stretches (``_advance_stretch``): when the
        # next input is due on the clock (inf: none).
        self.decode_horizon: Callable[[], float] | None = None
        self._running_columns = RunningColumns()  # what the last stretch left (its survivors)
        # The executor's token rule for one sequence: lets a stretch leave its survivors behind.
        self._tokens_of = getattr(executor, "sequence_tokens", None)
        self.header = {
            **(header or {}), "config": config.to_dict(), "block_size": config.kvcache_block_size,
            "num_blocks": config.num_kvcache_blocks, "hash_seed": config.hash_seed,
            "policy": config.policy, "eviction": config.eviction,
            "executor": executor.describe(),
        }
        source = policy_source(config.policy)
        if source is not None:
            self.header["policy_source"] = source
        if sink is not None:
            sink.open(self.header)

    def now(self) -> float:
        """Seconds since the engine started, on its clock."""
        return self.clock() - self.start_time

    def add_request(
        self,
        token_ids: list[int] | array,
        params: SamplingParams,
        arrival_s: float | None = None,
        error: str | None = None,
        priority: int = 0,
        token_bounds: tuple[int, int] | None = None,
    ) -> Sequence:
        """Queue a request; ``error`` (found by the caller, e.g. a bad token id) rejects it.

        A value no trace column can hold (a token id or ``max_tokens`` beyond int32) raises
        ``InvalidRequestError`` before anything is recorded: the recorder must never overflow.
        The rejection reason is recorded in the request's ``request_finished.error``.
        ``priority``: lower goes first; ``token_bounds``: the prompt's (min, max) id if known.
        ``arrival_s``: seconds on the engine's clock (None: now); NaN, infinite or negative
        raises ``InvalidRequestError`` (``check_arrival``) before anything is recorded."""
        check_arrival(arrival_s)
        self.outside.input()
        added = self.now()
        token_ids = int32_ids(token_ids)  # a list only where an id is past int32: refused next
        priority = check_recordable(token_ids, params, token_bounds, priority)  # a plain int
        arrival = added if arrival_s is None else arrival_s
        seq = Sequence(self.next_seq_id, token_ids, params, arrival)
        self.next_seq_id += 1
        self.sequences[seq.seq_id] = seq
        reason = self.scheduler.add(seq, precheck_error=error, priority=priority, added_s=added)
        if reason is not None:
            self.rejections[seq.seq_id] = reason
            self.events.patch_last_rejection(reason)
        return seq

    def on_idle(self) -> None:
        """The driver is about to wait for a later input: let the sink write what it holds
        (``EventSink.on_idle``), so a crash while idle loses no more than its flush interval."""
        if self.sink is not None and not self.closed:
            self.sink.on_idle(self.events)

    def waiting(self) -> None:
        """The driver is about to wait for a later input: not the driver's work (``outside_s``)."""
        self.outside.waiting()

    def abort(self, seq_id: int) -> None:
        self.finish(seq_id, "aborted")

    def finish(self, seq_id: int, reason: str) -> None:
        """Finish a request on an outside input (``aborted``, or ``stop``: a stop string found in
        its text), between steps; emits its ``block_freed`` rows and ``request_finished``. One
        finished (maybe in the step in flight) or forgotten is a no-op: replay never sees it."""
        self.outside.input()
        seq = self.sequences.get(seq_id)
        if seq is None and not 0 <= seq_id < self.next_seq_id:
            raise KeyError(f"no request {seq_id} was added to this engine")
        if seq is None or seq.is_finished:
            return
        self.drain()  # the sequence's last token must have its value before it is finished
        self._deferred_last = False  # the next step's inputs come after this change, not before
        self.scheduler.finish(seq, reason)

    def forget(self, seq_id: int) -> None:
        """Drop a finished request from ``sequences`` and ``rejections`` (a server that runs for
        days, or a streamed simulation, keeps nothing per finished request); later inputs naming
        it are ignored. Emits nothing."""
        seq = self.sequences.get(seq_id)
        if seq is not None and seq.is_finished:
            del self.sequences[seq_id]
            if self.rejections.pop(seq_id, None) is not None:
                self._forgotten_rejections += 1

    @property
    def last_step_deferred(self) -> bool:
        """Whether the last step scheduled was post-processed before its tokens were back (with
        an asynchronous executor it is still running when ``step`` returns)."""
        return self._deferred_last

    def has_unfinished(self) -> bool:
        """Requests queued or running, or steps not yet returned by ``step``."""
        return not self.scheduler.is_finished() or self._in_flight is not None or bool(self._ready)

    def step(self, decide: bool = True) -> StepResult | None:
        """Make one scheduling decision and run it; return the oldest step completed and not yet
        returned, or None (idle, or no step has completed yet: see ``has_unfinished``).

        With an executor that can launch asynchronously and ``config.async_scheduling``, a step
        whose tokens cannot change the next decision (``Scheduler.can_defer``) is post-processed
        with placeholder tokens right after its launch, and the next call schedules and launches
        the next step before waiting for those tokens: host work hides under device time. The
        decisions and the events (order and values) are exactly those of the sequential loop,
        one decision per call in both; only the returned result may lag one call behind.
        ``decide=False`` only resolves the step in flight, for a driver that reads its tokens
        before the next decision (``LLM.generate``'s stop strings), as the sequential loop."""
        cut = self._cut
        if cut.step is not None:
            cut.refuse()
        self.outside.entered()
        cut.step = self._in_flight.step if self._in_flight is not None else self.step_index
        (self._advance_loop if decide else self.drain)()
        cut.step = None
        self.outside.left()
        return self._ready.popleft() if self._ready else None

    def _advance_loop(self) -> bool:
        """Schedule and launch one step, resolving the one in flight; False when idle."""
        flight = self._in_flight
        if self.decode_horizon is not None and flight is None and not self._async and \
                self._advance_stretch():
            return True
        scheduler = self.scheduler
        if flight is not None and scheduler.schedule_needs_tokens():
            self._resolve(flight)
            flight = None
        overlappable = self._deferred_last and not scheduler.schedule_needs_tokens()
        began = self.clock()
        batch = scheduler.schedule()
        host_s = self.clock() - began
        if batch is None:
            self._deferred_last = False
            if flight is not None:
                self._resolve(flight)
                return True
            if scheduler.waiting:
                # Admission guarantees every queued request fits an empty pool: a bug, or a
                # user policy that admits nothing (then an error naming it).
                raise no_progress_error(self.config.policy, len(scheduler.waiting),
                                        len(scheduler.running))
            return False
        # A decision from scheduler state alone: replay and simulation get the same flags.
        batch.overlapped = overlappable and scheduler.takes_pending_inputs(batch)
        defer = self.config.async_scheduling and scheduler.can_defer(batch)
        self._deferred_last = defer
        if not self._async:
            began = self.clock()
            output = self.executor.execute(batch)
            ended = self.clock()
            host_s += ended - began - output.wait_s
            self._complete(batch, output, host_s, began, ended)
            return True
        if flight is not None and not batch.overlapped:
            self._resolve(flight)  # this batch's inputs come from the host: values first
            flight = None
        launched = self.clock()
        handle = self.executor.launch(batch, flight.handle if flight is not None else None)
        # A step computed inside launch (an eager or graph prefill) waited there for its tokens:
        # that is device time, not host work.
        host_s += self.clock() - launched - handle.launch_wait_s()
        if flight is not None:
            self._resolve(flight)
        if defer:
            self._in_flight = self._defer(batch, handle, launched, host_s)
            return True
        output = handle.result()
        self._complete(batch, output, host_s, launched, self.clock())
        return True

    def _advance_stretch(self) -> bool:
        """Run the decode steps before the next input is due as one stretch where the scheduler
        proves one (``engine.decode_stretch``), each priced, flagged and recorded as the
        sequential path does it; one result (the last step's, with every sequence finished in
        the stretch). False: nothing done. Emits what those steps emit, in the same order."""
        until = self.decode_horizon()  # type: ignore[misc]
        executor, scheduler = self.executor, self.scheduler
        stretch = DecodeStretch.plan(scheduler, executor.steps_within(until),
                                     self._running_columns, self._tokens_of)
        if stretch is None:
            return False
        scheduler.sync_running = None  # the stretch catches up each sequence it reads itself
        defer = self.config.async_scheduling  # every step of a stretch can be deferred
        rows = stretch.price(executor, self.clock, until, self._deferred_last, defer,
                             self.start_time, self._sink_s, self.outside.take())
        steps, first = len(rows["kind"]), self.step_index
        # A sink that folds the counts itself gets them instead of the sequence and token rows.
        counts_only = getattr(self.sink, "takes_decode_stretches", False)
        if not counts_only or self._tokens_of is None:  # (else tokens come when read)
            stretch.bind_tokens(executor.decode_tokens(stretch.seq_ids, stretch.completions, steps))
        finished = stretch.run(steps, first, rows, sequence_rows=not counts_only)
        if self._running_columns.lagging:  # the survivors take their tokens when next read
            scheduler.sync_running = self._sync_running
        sampled = stretch.sampled(steps)
        if counts_only:
            self.sink.add_decode_stretch(stretch.seq_ids, first, sampled)  # type: ignore
        total = sum(stretch.num_seqs[:steps])  # the tokens sampled
        executor.count_sampled(stretch.seq_ids, stretch.completions, sampled, total)
        self._deferred_last = defer
        self.step_index = first + steps
        self.events.step = self.step_index
        self.num_completion_tokens += total
        self._cut.whole(self.step_index - 1)
        if self.sink is not None:
            began = self.clock()
            self.sink.on_step_end(self.events)
            self._sink_s = self.clock() - began
        self._ready.append(stretch.result(steps, first, finished))
        return True

    def _sync_running(self) -> None:
        """Bring the sequences a stretch left behind up to date (``sync_running``)."""
        self.scheduler.sync_running = None
        self._running_columns.sync(self._tokens_of)  # type: ignore[arg-type]

    def _emit_model_step(self, batch: ScheduledBatch, output: StepOutput | None) -> int | None:
        """The model step event, measurements to be patched in when the step resolves."""
        prefill_tokens, prefill_work, decode_seqs, decode_ctx = batch_features(batch)
        padded = output.padded_batch_size if output is not None else 0
        graph_used = output.graph_used if output is not None else False
        padded_tokens = output.padded_tokens if output is not None else 0
        return self.events.emit_model_step(
            kind=batch.kind, duration_s=0.0, num_seqs=len(batch.seqs),
            prefill_tokens=prefill_tokens, prefill_attn_work=prefill_work,
            decode_seqs=decode_seqs, decode_context_tokens=decode_ctx,
            padded_batch_size=padded or len(batch.seqs), graph_used=graph_used, wall_time_s=0.0,
            overlapped=batch.overlapped, host_s=0.0, padded_tokens=padded_tokens,
            outside_s=self.outside.take(),
        )

    def _complete(
        self, batch: ScheduledBatch, output: StepOutput, host_s: float, began: float, ended: float
    ) -> None:
        """Post-process a step whose tokens are in: the sequential path."""
        post_began = self.clock()
        row = self._emit_model_step(batch, output)
        finished = self.scheduler.postprocess(batch, output.token_ids)
        step = self.step_index
        self.step_index += 1
        self.events.step = self.step_index
        duration = output.duration_s if output.duration_s is not None else ended - began
        host_s += self.clock() - post_began
        self._finish_step(batch, output, finished, row, duration, ended, host_s, step)

    def _defer(
        self, batch: ScheduledBatch, handle: PendingStep, launched: float, host_s: float
    ) -> InFlight:
        """Post-process a launched step with placeholder tokens (``Scheduler.postprocess_pending``).

        Events are emitted now, in sequential order; padded size and graph use are known at
        launch, so only measurements and token values wait for ``_resolve``.
        """
        began = self.clock()
        row = self._emit_model_step(batch, handle.launched_output())
        pending = self.scheduler.postprocess_pending(batch)
        step = self.step_index
        self.step_index += 1
        self.events.step = self.step_index
        return InFlight(batch, handle, pending, row, step, launched,
                        host_s + self.clock() - began)

    def _resolve(self, flight: InFlight) -> None:
        """Wait for an advanced step's tokens and fill them in everywhere."""
        self._in_flight = None
        output = flight.handle.result()
        ended = self.clock()
        self.scheduler.resolve(flight.pending, output.token_ids)
        duration = output.duration_s if output.duration_s is not None else ended - flight.launched
        finished = [seq for seq, _ in flight.pending.finished]
        host_s = flight.host_s + self.clock() - ended
        self._finish_step(flight.batch, output, finished, flight.model_row, duration, ended,
                          host_s, flight.step)

    def _finish_step(self, batch: ScheduledBatch, output: StepOutput, finished: list[Sequence],
                     row: int | None, duration: float, ended: float, host_s: float,
                     step: int) -> None:
        """Patch the step's measurements, hand the events to the sink, queue the result.

        The sink's time (recording) is host work of the next step: it is charged there.
        """
        if row is not None:
            self.events.patch_model_step(
                row, duration, ended - self.start_time, host_s + self._sink_s
            )
        self.num_completion_tokens += len(output.token_ids)
        self._cut.whole(step)  # its events are final: an exception from here on keeps them
        if self.sink is not None:
            began = self.clock()
            self.sink.on_step_end(self.events)
            self._sink_s = self.clock() - began
        self._ready.append(StepResult(step, batch, output, finished, duration))

    def drain(self) -> None:
        """Resolve a step still in flight (before an abort, or at the end of a run)."""
        if self._in_flight is not None:
            self._resolve(self._in_flight)

    def run_until_idle(self) -> None:
        """Step until every queued request has finished and every step has been returned."""
        while self.has_unfinished():
            self.step()

    def summary(self) -> dict[str, Any]:
        elapsed, tokens = self.now(), self.num_completion_tokens
        return {"steps": self.step_index, "requests": self.next_seq_id,
                "rejected": len(self.rejections) + self._forgotten_rejections,
                "completion_tokens": tokens, "preemptions": self.scheduler.num_preemptions,
                "elapsed_s": elapsed,
                "throughput_tok_s": tokens / elapsed if elapsed > 0 else 0.0,
                "end_time_unix": time.time()}

    def close(self, interrupted: bool = False) -> dict[str, Any]:
        """Flush the trace (if any) with a summary (``interrupted``: no summary, the trace stays
        incomplete: a prefix of the run); the engine takes no more steps. A step an exception cut
        short is dropped (``StepCut``), never waited for, and the trace is left incomplete."""
        if self._cut.rollback(self.events):
            self._in_flight, self.step_index, interrupted = None, self.events.step, True
        else:
            self.drain()
        summary = {**self.summary(), "interrupted": True} if interrupted else self.summary()
        if not self.closed and self.sink is not None:
            self.sink.close(self.events, summary)
        self.closed = True
        return summary
