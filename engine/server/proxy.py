"""A CPU stand-in for a GPU behind the server: the real engine core, scheduler and recorder over
an executor whose steps take a GPU's step times (fitted from one of its traces), so the
server's own overhead (TTFT it adds, throughput it loses) can be measured without the GPU.

The executor launches asynchronously, like the CUDA runner: a step starts when the previous
one ends (a device queue) and its tokens (seeded random, drawn from the tiny model's
tokenizer so the frontend detokenizes real text) are ready ``duration`` later; the host work
of the next step overlaps it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.batch import ScheduledBatch, StepOutput
from engine.engine_core import EngineCore, batch_features
from engine.gc_heap import freeze_startup_heap, release_heap

# A KV pool that never limits the proxy (the GPU's pool is sized from its memory).
PROXY_KV_BLOCKS = 65536


@dataclass(frozen=True)
class ProxyStepTimes:
    """A step's device time: ``base_s + prefill_token_s * prefill tokens + decode_seq_s *
    decode sequences`` (least squares over a trace's ``model_step`` rows)."""

    base_s: float
    prefill_token_s: float
    decode_seq_s: float
    source: str = ""

    def duration(self, batch: ScheduledBatch) -> float:
        prefill_tokens, _, decode_seqs, _ = batch_features(batch)
        return max(0.0, self.base_s + self.prefill_token_s * prefill_tokens
                   + self.decode_seq_s * decode_seqs)

    @classmethod
    def fit(cls, trace_dir: str) -> ProxyStepTimes:
        """Fit the model to the steps of the trace in ``trace_dir``."""
        from tracing import read_trace

        steps = read_trace(trace_dir).table("model_step").to_pandas()
        design = np.column_stack([np.ones(len(steps)), steps["prefill_tokens"],
                                  steps["decode_seqs"]]).astype(float)
        coef, *_ = np.linalg.lstsq(design, steps["duration_s"].to_numpy(dtype=float),
                                   rcond=None)
        return cls(float(coef[0]), float(coef[1]), float(coef[2]), str(trace_dir))


class ProxyStep:
    """A launched proxy step: its tokens are ready at ``ready_at`` (``time.perf_counter``)."""

    def __init__(self, output: StepOutput, ready_at: float) -> None:
        self.output = output
        self.ready_at = ready_at

    def launched_output(self) -> StepOutput:
        return self.output

    def result(self) -> StepOutput:
        left = self.ready_at - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return self.output

    def launch_wait_s(self) -> float:
        return 0.0


class ProxyExecutor:
    """Seeded random tokens after a GPU's step time; overlaps like the CUDA runner."""

    supports_overlap = True

    def __init__(self, times: ProxyStepTimes, num_kvcache_blocks: int, vocab_size: int,
                 seed: int = 0) -> None:
        self.times = times
        self.num_kvcache_blocks = num_kvcache_blocks
        self.vocab_size = vocab_size
        self._rng = np.random.default_rng(seed)
        self._device_free_at = 0.0

    def launch(self, batch: ScheduledBatch, previous: Any = None) -> ProxyStep:
        duration = self.times.duration(batch)
        start = max(time.perf_counter(), self._device_free_at)
        self._device_free_at = start + duration
        tokens = self._rng.integers(0, self.vocab_size, size=len(batch.sampled_seqs)).tolist()
        output = StepOutput(token_ids=tokens, duration_s=duration,
                            padded_batch_size=len(batch.seqs))
        return ProxyStep(output, self._device_free_at)

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        return self.launch(batch).result()

    def describe(self) -> dict[str, Any]:
        return {"executor": "proxy", "device": "cpu-proxy", "vocab_size": self.vocab_size,
                "step_times": self.times.__dict__}

    def close(self) -> None:
        pass


class ProxyEngine:
    """What the server needs of an engine (``core``, ``config``, ``vocab_size``, ``close``),
    over the proxy executor; the tiny model's tokenizer; a trace when ``trace_dir`` is set."""

    def __init__(self, times: ProxyStepTimes, trace_dir: str | None = None,
                 wrap_sink: Any = None, force: bool = False, **config_kwargs: Any) -> None:
        from engine.config import Config
        from engine.llm import _make_sink, _run_header
        from engine.model.checkpoint import default_model_dir
        from engine.model.tokenizer import load_tokenizer

        model_dir = str(default_model_dir())
        config = Config(model=model_dir, **{"num_kvcache_blocks": PROXY_KV_BLOCKS,
                                            "calibration_repeats": 0, **config_kwargs})
        self.tokenizer = load_tokenizer(model_dir)
        # Tokens below the added (special) ones: each detokenizes to text.
        self.vocab_size = int(self.tokenizer.vocab_size)
        executor = ProxyExecutor(times, config.num_kvcache_blocks, self.vocab_size,
                                 seed=config.seed)
        self.config = config
        sink = _make_sink(trace_dir, config, force, "serve") if trace_dir is not None else None
        if wrap_sink is not None:
            sink = wrap_sink(sink)
        self.core = EngineCore(config, executor, sink=sink, header=_run_header(config, executor),
                               record_events=sink is not None)
        if config.freeze_gc_heap:  # as the real engine does at the end of its start-up
            freeze_startup_heap()

    def close(self) -> dict[str, Any]:
        summary = self.core.close()
        if self.config.freeze_gc_heap:
            release_heap()
        return summary
