"""Timed synthetic recordings: a known step-time law in place of a model.

``record_workload`` records a workload through the engine's own ``EngineCore`` with NullExecutor
tokens and step times from a ``StepLaw`` (H200-like magnitudes, noise, a periodic recorder flush),
on a simulated clock. The tests use it to check time fidelity without GPU traces: a trace under
config A predicts config B's recorded times. With a ``HostLaw`` the recording is a version-2
trace: each step's host work (``host_s``), whether it was launched overlapped, and its interval
by the cost model's overlap rule (``replay.whatif.cost.overlap.interval``), from which a simulation
must recover another config's times when that config overlaps another fraction of its steps.

With ``prefill_graphs`` a prefill step runs as a CUDA-graph prefill where the engine would
(``engine.runner.prefill_graphs``: few enough prompts, tokens within the config's captured counts):
padded to a captured token count, which its per-token cost is paid on (the graph's GEMMs run
every padded row; attention only the real tokens), launched without an eager step's launch time,
and recorded as the engine records one (``graph_used``, ``padded_tokens``, the captured counts in
the header's executor description).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import graph_sizes
from engine.batch import ScheduledBatch, StepOutput
from engine.config import Config
from engine.engine_core import EngineCore, batch_features
from engine.executor import NullExecutor
from replay.recorded import RecordedEvents, from_columns
from replay.whatif.cost.overlap import interval
from replay.whatif.sim_executor import SimClock
from replay.workloads.request import Request


@dataclass(frozen=True)
class StepLaw:
    """A step's duration in seconds, linear in the batch features, times lognormal noise, plus
    a recorder flush every ``flush_every`` steps. Magnitudes are an H200 running Qwen3-0.6B."""

    base_s: float = 2.5e-3
    per_seq_s: float = 6e-6
    per_prefill_token_s: float = 1.2e-6
    per_attn_work_s: float = 4e-12
    per_padded_seq_s: float = 4e-6  # per decode row computed (padding rows of a graph too)
    per_context_token_s: float = 2.6e-8  # 112 KiB of KV per token at ~4.3 TB/s
    noise: float = 0.03
    flush_every: int = 64
    flush_s: float = 4e-3
    first_step_s: float = 0.0  # one-off extra time of step 0 (a JIT compilation, say)

    def duration(self, batch: ScheduledBatch, padded: int, rng: np.random.Generator,
                 padded_rows: int = 0) -> float:
        """``padded``: what a CUDA graph padded the step to, a decode's batch or a prefill's
        token count (0: eager, every row is real); ``padded_rows``: a mixed graph's decode
        rows (its ``padded`` is then its prefill part's token count)."""
        prefill_tokens, work, decode_seqs, context = batch_features(batch)
        graph_prefill = bool(padded) and batch.kind in ("prefill", "mixed")
        tokens = padded if graph_prefill else prefill_tokens
        rows = padded_rows or (decode_seqs if graph_prefill else padded or decode_seqs)
        seconds = (
            self.base_s
            + self.per_seq_s * len(batch.seqs)
            + self.per_prefill_token_s * tokens
            + self.per_attn_work_s * work
            + self.per_padded_seq_s * rows
            + self.per_context_token_s * context
        )
        seconds *= float(np.exp(rng.normal(0.0, self.noise)))
        if self.flush_every and (batch.step + 1) % self.flush_every == 0:
            seconds += self.flush_s
        if batch.step == 0:
            seconds += self.first_step_s
        return seconds


@dataclass(frozen=True)
class HostLaw:
    """The engine's own CPU work per step, ``base_s + per_seq_s * sequences`` (times lognormal
    noise), plus ``launch_s`` for an eager step (launching its kernels), and how it meets device
    time. A step is launched overlapped when the run overlaps (``Config.async_scheduling``) and
    it is a decode right after a decode (``overlaps``; ``follow_engine``: where the engine
    decided so, ``ScheduledBatch.overlapped``): its interval is ``max(device, host)``. A
    sequential eager step's is ``max(device, host) + sync_s``: its kernels run while the host
    launches them, and then it waits for its tokens. A sequential CUDA-graph decode's is
    ``device + host + sync_s``."""

    base_s: float = 1.2e-3
    per_seq_s: float = 1.5e-5
    sync_s: float = 1.5e-4
    launch_s: float = 0.0
    noise: float = 0.0
    follow_engine: bool = False

    def host(self, batch: ScheduledBatch, eager: bool, rng: np.random.Generator) -> float:
        seconds = self.base_s + self.per_seq_s * len(batch.seqs)
        if self.noise:
            seconds *= float(np.exp(rng.normal(0.0, self.noise)))
        return seconds + (self.launch_s if eager else 0.0)

    def interval(self, device: float, host: float, overlapped: bool, eager: bool) -> float:
        """The cost model's rule (``interval``), with a sync latency for a sequential step."""
        return interval(device, host, overlapped or eager, 0.0 if overlapped else self.sync_s)

    @staticmethod
    def overlaps(previous: ScheduledBatch | None, batch: ScheduledBatch, enabled: bool) -> bool:
        """The synthetic launch decision (a stand-in for the engine's; from the batches alone)."""
        return enabled and previous is not None and previous.is_decode and batch.is_decode


DEFAULT_DECODE_GRAPH_SIZES = graph_sizes.decode_graph_sizes()


def nano_padded(batch_size: int) -> int:
    """The CUDA-graph batch a decode of ``batch_size`` pads to under the engine's default sizes
    (0: too large, eager)."""
    return graph_sizes.padded_decode_size(DEFAULT_DECODE_GRAPH_SIZES, batch_size)


class LawExecutor(NullExecutor):
    """NullExecutor tokens; step times from a ``StepLaw``, advancing a ``SimClock``.

    ``host``: also the engine's host work per step and overlapped launches (``HostLaw``), when
    ``overlap``. ``measured`` logs, per step, (device s, host s or NaN, overlapped, end time)."""

    def __init__(self, num_kvcache_blocks: int, clock: SimClock, law: StepLaw, seed: int = 0,
                 graphs: bool = True, host: HostLaw | None = None, overlap: bool = False,
                 prefill_graph_sizes: list[int] | None = None,
                 mixed_decode_sizes: list[int] | None = None,
                 prefill_graph_seqs: int = graph_sizes.LEGACY_PREFILL_GRAPH_SEQS) -> None:
        super().__init__(num_kvcache_blocks, seed=seed)
        self.clock = clock
        self.law = law
        self.graphs = graphs
        # Captured prefill token counts (empty: every prefill runs eager).
        self.prefill_sizes = list(prefill_graph_sizes or [])
        self.prefill_graph_seqs = prefill_graph_seqs
        # Decode capacities of the mixed-step graphs (empty: mixed steps run eager).
        self.mixed_sizes = list(mixed_decode_sizes or []) if self.prefill_sizes else []
        self.host_law = host
        self.overlap = overlap
        self._noise = np.random.default_rng(seed + 1)
        self._previous: ScheduledBatch | None = None
        self.measured: dict[int, tuple[float, float, bool, float]] = {}

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        out = super().execute(batch)
        padded = nano_padded(len(batch.seqs)) if self.graphs and batch.kind == "decode" else 0
        padded_tokens = self._padded_tokens(batch)
        mixed = self._mixed_key(batch)
        padded_rows = 0
        if mixed is not None:  # recorded as the runner does: every row the graph computes
            padded_tokens, padded_rows = mixed[0] + mixed[1], mixed[1]
        padded = padded or (mixed[0] if mixed is not None else padded_tokens)
        seconds = self.law.duration(batch, padded, self._noise, padded_rows)
        host, interval = float("nan"), seconds
        if self.host_law is not None:
            eager = not padded
            host = self.host_law.host(batch, eager, self._noise)
            if not self.host_law.follow_engine:  # the engine records the rule's decision
                batch.overlapped = HostLaw.overlaps(self._previous, batch, self.overlap)
            interval = self.host_law.interval(seconds, host, batch.overlapped, eager)
        self._previous = batch
        overlapped = batch.overlapped  # without a HostLaw: the engine's own (not priced)
        self.clock.now += interval
        self.measured[batch.step] = (seconds, host, overlapped, self.clock.now)
        wait = interval - host if self.host_law is not None else interval
        # A graph prefill pads tokens, not its batch: its padded_batch_size is its own.
        batch_size = len(batch.seqs) if padded_tokens else padded or len(batch.seqs)
        return StepOutput(out.token_ids, seconds, batch_size, bool(padded), wait_s=wait,
                          padded_tokens=padded_tokens)

    def _padded_tokens(self, batch: ScheduledBatch) -> int:
        """The captured count a prefill step pads to, as the engine decides (0: eager)."""
        if not self.prefill_sizes or batch.kind != "prefill":
            return 0
        return graph_sizes.padded_prefill_tokens(self.prefill_sizes, batch_features(batch)[0],
                                                   len(batch.seqs), self.prefill_graph_seqs)

    def _mixed_key(self, batch: ScheduledBatch) -> tuple[int, int] | None:
        """The mixed graph a mixed step replays, as the engine decides (None: eager)."""
        if not self.mixed_sizes or batch.kind != "mixed":
            return None
        prefill_tokens, _, decode_seqs, _ = batch_features(batch)
        return graph_sizes.mixed_graph_key(self.prefill_sizes, self.mixed_sizes, prefill_tokens,
                                           len(batch.seqs) - decode_seqs, decode_seqs)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"executor": "law", "device": "synthetic"}
        if self.prefill_sizes:  # as the model runner describes its captured prefill graphs
            out.update(prefill_graph_tokens=list(self.prefill_sizes),
                       prefill_graph_max_seqs=self.prefill_graph_seqs)
        return out


def record_workload(
    config: Config,
    requests: list[Request],
    law: StepLaw | None = StepLaw(),
    trace_dir: str | None = None,
    seed: int = 0,
    host: HostLaw | None = None,
    prefill_graphs: bool = False,
) -> RecordedEvents:
    """Record ``requests`` under ``config`` with law-timed steps (``law=None``: NullExecutor).

    The returned events' step measurements are the law's own: without ``host`` the trace
    records no host work (``host_s`` NaN, as in a version-1 trace: the law's interval is its
    duration); with it, ``host_s`` and ``overlapped`` (decided by ``HostLaw.overlaps`` under
    ``config.async_scheduling``). A trace written to ``trace_dir`` keeps what the engine wrote.
    ``prefill_graphs``: prefills run through CUDA graphs where the engine would run them so
    under ``config`` (else every prefill is eager, as in a trace before prefill graphs)."""
    from tracing.sink import MemorySink

    clock = SimClock(0.0)
    if law is None:
        executor: Any = NullExecutor(config.num_kvcache_blocks, seed=seed)
    else:
        sizes, mixed = [], []
        if prefill_graphs and graph_sizes.prefill_graph_limit(config):
            sizes = graph_sizes.prefill_graph_sizes(graph_sizes.prefill_graph_limit(config))
            mixed = graph_sizes.mixed_graph_decode_sizes(config)
        executor = LawExecutor(config.num_kvcache_blocks, clock, law, seed,
                               graphs=not config.enforce_eager, host=host,
                               overlap=config.async_scheduling, prefill_graph_sizes=sizes,
                               mixed_decode_sizes=mixed,
                               prefill_graph_seqs=graph_sizes.prefill_graph_prompts(config))
    sink: Any = MemorySink()
    if trace_dir is not None:
        from tracing.recorder import ParquetRecorder

        sink = ParquetRecorder(trace_dir, overwrite=True, fsync=False)
    timed = {"clock": clock} if law is not None else {}
    core = EngineCore(config, executor, sink=sink, **timed)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i))
    cursor = 0
    while True:
        # Arrivals by the law clock, as replay.cli.live does on a real one.
        while cursor < len(order) and requests[order[cursor]].arrival_s <= clock.now:
            r = requests[order[cursor]]
            core.add_request(list(r.prompt), r.sampling_params(), arrival_s=r.arrival_s)
            cursor += 1
        if core.step() is None:
            if cursor >= len(order):
                break
            clock.now = max(clock.now, requests[order[cursor]].arrival_s)
    core.close()
    if trace_dir is not None:
        from replay.recorded import from_trace
        from tracing.reader import read_trace

        events = from_trace(read_trace(trace_dir))
    else:
        events = from_columns(sink.header, sink.tables)
    if law is not None:
        _law_measurements(events, executor.measured)
    return events


def _law_measurements(events: RecordedEvents,
                      measured: dict[int, tuple[float, float, bool, float]]) -> None:
    """Set the model_step measurements to the law's (whatever the engine measured itself)."""
    ms = events.tables["model_step"]
    rows = [measured[int(step)] for step in ms["step"]]
    for i, (name, dtype) in enumerate((("duration_s", float), ("host_s", float),
                                       ("overlapped", bool), ("wall_time_s", float))):
        ms[name] = np.array([row[i] for row in rows], dtype=dtype)


def law_profile(config: Config, law: StepLaw = StepLaw(flush_every=0),
                host: HostLaw | None = None, seed: int = 0, budget_s: float = float("inf"),
                repeats: int = 1) -> dict[str, Any]:
    """A device profile (``engine.profiling.run_profile``) of a law-timed executor on a
    simulated clock: the profile a GPU whose steps follow ``law`` would give under ``config``
    (its pool and limits bound the grid)."""
    from engine.profiling import run_profile

    clock = SimClock(0.0)
    executor = LawExecutor(config.num_kvcache_blocks, clock, law, seed, host=host)
    return run_profile(executor, config, budget_s, repeats, clock=lambda: clock.now,
                       engine_version="synthetic")
