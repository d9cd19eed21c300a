"""``model_step.host_s`` is the engine thread's own work, never time spent waiting for the device.

A fake executor on a manual clock spends ``WORK_S`` of host work and ``WAIT_S`` waiting per step,
and says so (``StepOutput.wait_s``). Whether the engine calls ``execute`` (sequential loop) or
``launch`` (overlapped scheduling), and whether the step completes inside ``launch`` (an eager or
graph prefill on the GPU) or later in ``result`` (a decode in flight), every step must record
``host_s == WORK_S``: the clock moves only inside the executor here.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.batch import ScheduledBatch, StepOutput
from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import DoneStep
from engine.sampling_params import SamplingParams
from tracing.sink import MemorySink

WORK_S = 0.002
WAIT_S = 0.010
TOKEN = 7


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _InFlight:
    """A step whose tokens are waited for in ``result``."""

    def __init__(self, clock: _Clock, rows: int) -> None:
        self.clock, self.rows = clock, rows

    def launched_output(self) -> StepOutput:
        return StepOutput(token_ids=[])

    def launch_wait_s(self) -> float:
        return 0.0

    def result(self) -> StepOutput:
        self.clock.now += WAIT_S
        return StepOutput([TOKEN] * self.rows, duration_s=WAIT_S, wait_s=WAIT_S)


class _TimedExecutor:
    """Prefills complete inside ``launch`` (waiting there), decodes in ``result``."""

    supports_overlap = True

    def __init__(self, clock: _Clock, num_kvcache_blocks: int) -> None:
        self.clock, self.num_kvcache_blocks = clock, num_kvcache_blocks

    def launch(self, batch: ScheduledBatch, previous: Any = None) -> Any:
        self.clock.now += WORK_S
        rows = len(batch.sampled_seqs)
        if batch.is_decode:
            return _InFlight(self.clock, rows)
        self.clock.now += WAIT_S
        output = StepOutput([TOKEN] * rows, duration_s=WAIT_S, wait_s=WAIT_S)
        return DoneStep(output, [seq.seq_id for seq in batch.sampled_seqs])

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        return self.launch(batch).result()

    def describe(self) -> dict[str, Any]:
        return {"executor": "timed-fake"}

    def close(self) -> None:
        pass


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["overlapped", "sequential"])
def test_host_time_excludes_waiting_for_the_device(async_scheduling: bool) -> None:
    clock = _Clock()
    config = Config(num_kvcache_blocks=16, kvcache_block_size=16, max_model_len=128,
                    max_num_batched_tokens=256, async_scheduling=async_scheduling)
    sink = MemorySink()
    core = EngineCore(config, _TimedExecutor(clock, 16), sink=sink, header={}, clock=clock)
    for prompt in ([1, 2, 3], [4, 5, 6, 8, 9]):
        core.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while core.has_unfinished():
        core.step()
    core.close()
    steps = sink.tables["model_step"]
    assert "prefill" in steps["kind"] and "decode" in steps["kind"]
    assert steps["host_s"] == pytest.approx([WORK_S] * len(steps["host_s"]))
    assert steps["duration_s"] == pytest.approx([WAIT_S] * len(steps["duration_s"]))
