"""Drive the real EngineCore with the NullExecutor on small workloads, into any sink."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from tracing.recorder import ParquetRecorder
from tracing.schema import EVENT_KINDS, column_types
from tracing.sink import MemorySink

CLOCK_TICK_S = 0.001


class FakeClock:
    """A clock that advances one tick per reading: two runs of one workload read equal times."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += CLOCK_TICK_S
        return self.now


@dataclass(frozen=True)
class Req:
    prompt: list[int]
    max_tokens: int
    temperature: float = 0.6


@dataclass(frozen=True)
class Workload:
    requests: list[Req]
    num_blocks: int = 64
    block_size: int = 4
    max_model_len: int = 128
    policy: str = "prefill_first"
    max_num_seqs: int = 16
    extra: dict[str, Any] = field(default_factory=dict)

    def config(self) -> Config:
        return Config(
            num_kvcache_blocks=self.num_blocks,
            kvcache_block_size=self.block_size,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=max(self.max_model_len, 256),
            max_num_seqs=self.max_num_seqs,
            policy=self.policy,
            **self.extra,
        )


def run_engine(
    workload: Workload,
    sink: Any,
    executor: Any = None,
    late_requests: Sequence[Req] = (),
) -> dict[str, Any]:
    """Run ``workload`` to completion into ``sink`` and close; ``late_requests`` arrive after."""
    config = workload.config()
    core = EngineCore(
        config,
        executor if executor is not None else NullExecutor(workload.num_blocks, vocab_size=1000),
        sink=sink,
        header={"model": {"architecture": "null"}, "device": "cpu: test"},
        clock=FakeClock(),
    )
    for req in workload.requests:
        core.add_request(req.prompt, _params(req))
    core.run_until_idle()
    for req in late_requests:
        core.add_request(req.prompt, _params(req))
    return core.close()


def _params(req: Req) -> SamplingParams:
    return SamplingParams(temperature=req.temperature, max_tokens=req.max_tokens, ignore_eos=True)


def record(workload: Workload, trace_dir: Path, **recorder_kwargs: Any) -> ParquetRecorder:
    recorder_kwargs.setdefault("fsync", False)
    recorder = ParquetRecorder(trace_dir, **recorder_kwargs)
    run_engine(workload, recorder)
    return recorder


def in_memory(workload: Workload) -> MemorySink:
    sink = MemorySink()
    run_engine(workload, sink)
    return sink


def expected_pydict(kind: str, columns: dict[str, list]) -> dict[str, list]:
    """The in-memory columns as Arrow would hand them back (float32 columns rounded)."""
    import numpy as np

    out = {}
    for name, t in column_types(kind).items():
        values = columns[name]
        if t == "float32":
            values = np.asarray(values, dtype=np.float32).astype(np.float64).tolist()
        elif t.startswith("list<"):  # an int32 array prompt (engine/prompt_ids.py) as a list
            values = [None if v is None else list(v) for v in values]
        out[name] = values
    return out


def assert_same_events(trace: Any, sink: MemorySink) -> None:
    for kind in EVENT_KINDS:
        got = trace.table(kind).to_pydict()
        want = expected_pydict(kind, sink.tables[kind])
        assert got == want, f"{kind} differs"


def reference_like(num_seqs: int = 24, seed: int = 0) -> Workload:
    """A scaled-down reference workload: random prompts, shared prefixes, a tight KV pool."""
    import random

    rng = random.Random(seed)
    shared = [rng.randrange(1000) for _ in range(16)]
    requests = []
    for i in range(num_seqs):
        own = [rng.randrange(1000) for _ in range(rng.randint(1, 40))]
        prompt = (shared if i % 2 else []) + own
        requests.append(Req(prompt, rng.randint(1, 40)))
    return Workload(requests, num_blocks=40, block_size=4, max_model_len=128)


class SlowExecutor(NullExecutor):
    """The null executor, sleeping per step so a test can kill the process mid-run."""

    def __init__(self, num_blocks: int, sleep_s: float) -> None:
        super().__init__(num_blocks, vocab_size=1000)
        self.sleep_s = sleep_s

    def execute(self, batch: Any) -> Any:
        time.sleep(self.sleep_s)
        return super().execute(batch)


def record_overlapped(workload: Workload, trace_dir: Path, flush_steps: int = 3) -> Path:
    """Record ``workload`` under async scheduling (the null executor's overlap): each step's
    schedule is made before the step before it is cut into a segment."""
    recorder = ParquetRecorder(trace_dir, fsync=False, flush_steps=flush_steps)
    core = EngineCore(workload.config(),
                      NullExecutor(workload.num_blocks, vocab_size=1000, overlap=True),
                      sink=recorder, clock=FakeClock(),
                      header={"model": {"architecture": "null"}, "device": "cpu: test"})
    for req in workload.requests:
        core.add_request(req.prompt, _params(req))
    core.run_until_idle()
    core.close()
    return trace_dir


def kill_after_partial_step(full: Path, cut: Path, kind: str) -> Path:
    """Copy ``full`` to ``cut`` as a killed run leaves it (no summary.json, later markers gone),
    cut after the first segment committing a ``kind`` row of the step after its own last one."""
    import shutil

    import pyarrow.parquet as pq

    from tracing.layout import COMMITS_DIR
    from tracing.reader import read_trace

    def partial(seg: Any) -> bool:
        return any(
            (pq.read_table(f.located(), columns=["step"]).column("step").to_numpy()
             > seg.through_step).any()
            for f in seg.files if f.kind == kind)

    keep = next(seg.index + 1 for seg in read_trace(full).segment_list() if partial(seg))
    shutil.copytree(full, cut)
    (cut / "summary.json").unlink()
    for marker in sorted((cut / COMMITS_DIR).glob("seg-*.json"))[keep:]:
        marker.unlink()
    return cut
