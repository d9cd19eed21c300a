"""Re-drive the engine's own scheduler from a recording: same inputs, same step boundaries.

``TraceExecutor`` answers each step with the tokens the recording sampled at that step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import graph_sizes
from engine.batch import ScheduledBatch, StepOutput
from engine.config import Config
from engine.drive import drive
from engine.engine_core import EngineCore, StepResult
from engine.errors import ConfigError, ReplayLLMError
from engine.policy import is_import_path
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from replay.recorded import RecordedEvents, from_columns
from tracing.sink import MemorySink

PRECHECK_REJECTION = "rejected before scheduling (as recorded)"
# Finish reasons that are inputs to the scheduler, not its decisions: an abort, and a stop string
# found in the detokenized text (outside the scheduler). Replay feeds them at their recorded step.
OUTSIDE_FINISHES = ("aborted", "stop")


class HeaderError(ReplayLLMError):
    """The recording's header cannot rebuild the engine configuration."""


class ReplayDiverged(Exception):
    """The scheduler asked for tokens the recording does not have: decisions already differ."""

    def __init__(self, step: int, detail: str) -> None:
        super().__init__(f"step {step}: {detail}")
        self.step = step


def _group_by_step(steps: np.ndarray, *columns: np.ndarray) -> dict[int, tuple[list, ...]]:
    """Split step-sorted columns into per-step Python lists."""
    if len(steps) == 0:
        return {}
    order = np.argsort(steps, kind="stable")
    steps = steps[order]
    columns = tuple(c[order] for c in columns)
    unique, starts = np.unique(steps, return_index=True)
    ends = np.append(starts[1:], len(steps))
    return {
        int(step): tuple(c[a:b].tolist() for c in columns)
        for step, a, b in zip(unique, starts, ends)
    }


class TraceExecutor:
    """Returns, for step ``s``, the tokens recorded at step ``s`` for the same sequences.

    If the scheduler's batch samples other sequences than the recording did, it raises
    ``ReplayDiverged``: the decision events emitted so far already show where they part.
    """

    def __init__(self, recorded: RecordedEvents, num_kvcache_blocks: int) -> None:
        self.num_kvcache_blocks = num_kvcache_blocks
        tokens = recorded.tables["token_sampled"]
        self._tokens = _group_by_step(
            np.asarray(tokens["step"]), np.asarray(tokens["seq_id"]), np.asarray(tokens["token_id"])
        )
        steps = recorded.tables["model_step"]
        self._steps = {
            int(step): (float(duration), int(padded), bool(graph), int(tokens))
            for step, duration, padded, graph, tokens in zip(
                np.asarray(steps["step"]).tolist(),
                np.asarray(steps["duration_s"]).tolist(),
                np.asarray(steps["padded_batch_size"]).tolist(),
                np.asarray(steps["graph_used"]).tolist(),
                np.asarray(steps["padded_tokens"]).tolist(),
            )
        }

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        measured = self._steps.get(batch.step)
        if measured is None:
            raise ReplayDiverged(batch.step, "the recording has no model step here")
        wanted = [seq.seq_id for seq in batch.sampled_seqs]
        seq_ids, token_ids = self._tokens.get(batch.step, ([], []))
        if seq_ids != wanted:
            raise ReplayDiverged(
                batch.step, f"replay samples sequences {wanted[:8]}..., recording {seq_ids[:8]}..."
            )
        duration, padded, graph, padded_tokens = measured
        return StepOutput(
            token_ids=token_ids, duration_s=duration, padded_batch_size=padded, graph_used=graph,
            padded_tokens=padded_tokens,
        )

    def describe(self) -> dict[str, Any]:
        return {"executor": "trace"}

    def close(self) -> None:
        pass


def config_from_header(header: dict[str, Any], **overrides: Any) -> Config:
    """The Config a trace was recorded under (``overrides`` applied, validated)."""
    recorded = header.get("config")
    if not isinstance(recorded, dict):
        raise HeaderError("the trace header has no 'config' object")
    recorded = dict(recorded)
    # Recorded before the field existed: that engine never overlapped steps.
    recorded.setdefault("async_scheduling", False)
    # ... nor ran a prefill through a CUDA graph; and deferred a decode only with one free block
    # per running sequence.
    recorded.setdefault("prefill_graph_tokens", 0)
    # Recorded before prefill_graph_seqs existed: that engine's prefill graphs took 16 prompts.
    recorded.setdefault("prefill_graph_seqs", graph_sizes.LEGACY_PREFILL_GRAPH_SEQS)
    recorded.setdefault("defer_block_rule", "per_running")
    # ... nor deferred a mixed step (a decode's full block entered the cache at once).
    recorded.setdefault("overlap_mixed_steps", False)
    # Kernel and BLAS choices were environment variables then; their defaults are these.
    recorded.setdefault("fused_kernels", True)
    recorded.setdefault("fused_kv_store", True)
    recorded.setdefault("blas_library", "default")
    # Every projection ran through cuBLAS before the split-K decode GEMMs existed.
    recorded.setdefault("split_k_gemm", False)
    recorded.setdefault("decode_gemm_prefetch", False)
    recorded.setdefault("decode_qk_prologue", False)
    recorded.setdefault("programmatic_launch", False)
    recorded.setdefault("decode_longest_first", False)
    # Eager long prompts ran the Triton kernel before the field existed.
    recorded.setdefault("long_prefill_kernel", "triton")
    # ... and left the start-up heap to the collector's full passes.
    recorded.setdefault("freeze_gc_heap", False)
    # ... and kept one block per cached hash (a copy's hash left with the indexed block).
    recorded.setdefault("prefix_cache_duplicates", False)
    known = set(Config.field_names())
    unknown = sorted(set(recorded) - known)
    if unknown:
        raise HeaderError(f"the trace header's config has unknown fields: {', '.join(unknown)}")
    try:
        config = Config(**recorded)
        return config.replace(**overrides) if overrides else config
    except (TypeError, ValueError) as exc:
        policy = overrides.get("policy", recorded.get("policy"))
        if isinstance(exc, ConfigError) and is_import_path(str(policy)) and str(policy) in str(exc):
            # A sound header whose user policy's code is not importable here (another machine,
            # another directory): say so, not that the config is invalid.
            raise HeaderError(f"the trace was recorded with the user policy {policy!r}, "
                              f"which cannot be loaded here: {exc}") from None
        raise HeaderError(f"the trace header's config is invalid: {exc}") from None


@dataclass(frozen=True)
class _Input:
    event_id: int
    step: int
    action: str  # "add", or the reason of a finish from outside the scheduler (OUTSIDE_FINISHES)
    seq_id: int


def _inputs(recorded: RecordedEvents) -> tuple[list[_Input], dict[int, str]]:
    """Requests and outside finishes (aborts, stops) in recorded order, and the recorded
    reason of each finished request."""
    added = recorded.tables["request_added"]
    finished = recorded.tables["request_finished"]
    errors = finished.get("error")
    if errors is None:
        errors = [""] * len(finished["seq_id"])
    # seq id -> (finish reason, recorded rejection reason: "" before schema version 5)
    reasons = dict(zip(np.asarray(finished["seq_id"]).tolist(),
                       zip(np.asarray(finished["reason"]).tolist(), list(errors))))
    inputs = [
        _Input(int(eid), int(step), "add", int(sid))
        for eid, step, sid in zip(added["event_id"], added["step"], added["seq_id"])
    ]
    inputs += [
        _Input(int(eid), int(step), str(reason), int(sid))
        for eid, step, sid, reason in zip(
            finished["event_id"], finished["step"], finished["seq_id"], finished["reason"]
        )
        if reason in OUTSIDE_FINISHES
    ]
    inputs.sort(key=lambda i: i.event_id)
    return inputs, reasons


@dataclass
class ReplayRun:
    """The replayed event stream and where the replay stopped."""

    replayed: RecordedEvents
    steps: int
    stopped_early: str | None


class _RecordedInputs:
    """The recording's requests and aborts, each due at the step it was recorded before."""

    def __init__(self, recorded: RecordedEvents) -> None:
        self.recorded = recorded
        self.inputs, self.reasons = _inputs(recorded)
        added = recorded.tables["request_added"]
        self.request_rows = {int(sid): i for i, sid in enumerate(added["seq_id"])}
        self.cursor = 0

    def feed(self, core: EngineCore, now: float) -> None:
        inputs, added = self.inputs, self.recorded.tables["request_added"]
        while self.cursor < len(inputs) and inputs[self.cursor].step <= now:
            item = inputs[self.cursor]
            self.cursor += 1
            if item.action != "add":
                if item.seq_id in core.sequences:
                    core.finish(item.seq_id, item.action)
                continue
            row = self.request_rows[item.seq_id]
            params = self.recorded.request_params(row)
            prompt = added["prompt_token_ids"][row]
            core.add_request(prompt, params, arrival_s=float(added["arrival_s"][row]),
                             error=_precheck(core, item.seq_id, prompt, params, self.reasons),
                             priority=self.recorded.request_priority(row))

    def next_due(self) -> float | None:
        return self.inputs[self.cursor].step if self.cursor < len(self.inputs) else None

    def on_result(self, result: StepResult, now: float) -> None:
        pass


def replay(recorded: RecordedEvents, **overrides: Any) -> ReplayRun:
    """Feed the recording's requests, aborts and sampled tokens through a fresh EngineCore."""
    config = config_from_header(recorded.header, **overrides)
    executor = TraceExecutor(recorded, config.num_kvcache_blocks)
    sink = MemorySink()
    core = EngineCore(config, executor, sink=sink, header=recorded.header)
    floor = [0]  # inputs due at a later step while the engine idles join at once

    def wait_until(due: float) -> None:
        floor[0] = int(due)

    stopped: str | None = None
    try:
        drive(core, _RecordedInputs(recorded), lambda: max(core.step_index, floor[0]),
              wait_until)
    except ReplayDiverged as exc:
        stopped = str(exc)
        # Keep the decision events the cut step emitted before its executor refused it (close
        # would drop them with the step): they show which decision parted from the recording.
        sink.snapshot(core.events)
    steps = core.step_index
    core.close()
    replayed = from_columns(recorded.header, sink.tables)
    return ReplayRun(replayed, steps, stopped)


def _precheck(
    core: EngineCore,
    seq_id: int,
    prompt: list[int],
    params: SamplingParams,
    reasons: dict[int, tuple[str, str]],
) -> str | None:
    """A rejection the recording made before the scheduler saw the request (e.g. a bad token),
    with its recorded reason where the trace stores one."""
    reason, error = reasons.get(seq_id, ("", ""))
    if reason != "rejected":
        return None
    # Only a request the scheduler itself would accept needs the recorded verdict passed in.
    probe = Sequence(seq_id, prompt, params)
    return None if core.scheduler.admission_error(probe) else (error or PRECHECK_REJECTION)
