"""The step loop shared by every driver: live (a model), replay (a trace), simulate (a cost model).

``EngineCore`` owns the event buffer, the scheduler and an executor. One ``step`` schedules a
batch, executes it, records the model step and post-processes the sampled tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.batch import ScheduledBatch, StepOutput
from engine.config import AUTO_SIZED_BLOCKS, Config
from engine.executor import Executor
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from tracing.events import EventBuffer, NullEventBuffer
from tracing.sink import EventSink


@dataclass
class StepResult:
    """What one step did: the batch, its output and the sequences that finished in it."""

    step: int
    batch: ScheduledBatch
    output: StepOutput
    finished: list[Sequence]
    duration_s: float


def batch_features(batch: ScheduledBatch) -> tuple[int, int, int, int]:
    """(prefill tokens, sum of query x context over prefill work, decode seqs, decode context)."""
    num_prefill = batch.num_prefill_seqs
    if num_prefill == 0:
        return 0, 0, len(batch.seqs), sum(batch.context_lens)
    new = batch.num_new_tokens[:num_prefill]
    ctx = batch.context_lens[:num_prefill]
    return (
        sum(new),
        sum(q * c for q, c in zip(new, ctx)),
        len(batch.seqs) - num_prefill,
        sum(batch.context_lens[num_prefill:]),
    )


class EngineCore:
    """Scheduler + executor + event buffer, stepping in lock-step.

    ``clock`` supplies wall time for measurements only (never for decisions); the simulator passes
    a simulated clock.
    """

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
        self.scheduler = Scheduler(config, config.num_kvcache_blocks, self.events)
        self.sink = sink
        self.clock = clock
        self.start_time = clock()
        self.step_index = 0
        self.next_seq_id = 0
        self.sequences: dict[int, Sequence] = {}
        self.rejections: dict[int, str] = {}
        self.num_completion_tokens = 0
        self.busy_time_s = 0.0
        self.closed = False
        self.header = {
            **(header or {}),
            "config": config.to_dict(),
            "block_size": config.kvcache_block_size,
            "num_blocks": config.num_kvcache_blocks,
            "hash_seed": config.hash_seed,
            "policy": config.policy,
            "executor": executor.describe(),
        }
        if sink is not None:
            sink.open(self.header)

    def now(self) -> float:
        """Seconds since the engine started, on its clock."""
        return self.clock() - self.start_time

    def add_request(
        self,
        token_ids: list[int],
        params: SamplingParams,
        arrival_s: float | None = None,
        error: str | None = None,
    ) -> Sequence:
        """Queue a request; ``error`` (found by the caller, e.g. a bad token id) rejects it."""
        seq = Sequence(
            self.next_seq_id, token_ids, params, self.now() if arrival_s is None else arrival_s
        )
        self.next_seq_id += 1
        self.sequences[seq.seq_id] = seq
        reason = self.scheduler.add(seq, precheck_error=error)
        if reason is not None:
            self.rejections[seq.seq_id] = reason
        return seq

    def abort(self, seq_id: int) -> None:
        self.scheduler.abort(self.sequences[seq_id])

    def has_unfinished(self) -> bool:
        return not self.scheduler.is_finished()

    def step(self) -> StepResult | None:
        """Run one step; None when nothing is queued."""
        batch = self.scheduler.schedule()
        if batch is None:
            if self.scheduler.waiting:
                # Admission guarantees every queued request fits an empty pool: this is a bug.
                raise RuntimeError(
                    f"scheduler made no progress with {len(self.scheduler.waiting)} waiting "
                    f"and {len(self.scheduler.running)} running sequences"
                )
            return None
        began = self.clock()
        output = self.executor.execute(batch)
        ended = self.clock()
        duration = output.duration_s if output.duration_s is not None else ended - began
        prefill_tokens, prefill_work, decode_seqs, decode_ctx = batch_features(batch)
        self.events.emit_model_step(
            batch.kind,
            duration,
            len(batch.seqs),
            prefill_tokens,
            prefill_work,
            decode_seqs,
            decode_ctx,
            output.padded_batch_size or len(batch.seqs),
            output.graph_used,
            ended - self.start_time,
        )
        finished = self.scheduler.postprocess(batch, output.token_ids)
        self.num_completion_tokens += len(output.token_ids)
        self.busy_time_s += ended - began
        step = self.step_index
        self.step_index += 1
        self.events.step = self.step_index
        if self.sink is not None:
            self.sink.on_step_end(self.events)
        return StepResult(step, batch, output, finished, duration)

    def run_until_idle(self) -> None:
        """Step until every queued request has finished."""
        while self.step() is not None:
            pass

    def summary(self) -> dict[str, Any]:
        elapsed = self.now()
        return {
            "steps": self.step_index,
            "requests": self.next_seq_id,
            "rejected": len(self.rejections),
            "completion_tokens": self.num_completion_tokens,
            "preemptions": self.scheduler.num_preemptions,
            "elapsed_s": elapsed,
            "throughput_tok_s": self.num_completion_tokens / elapsed if elapsed > 0 else 0.0,
            "end_time_unix": time.time(),
        }

    def close(self) -> dict[str, Any]:
        """Flush the trace (if any) with a summary; the engine takes no more steps."""
        summary = self.summary()
        if not self.closed and self.sink is not None:
            self.sink.close(self.events, summary)
        self.closed = True
        return summary
