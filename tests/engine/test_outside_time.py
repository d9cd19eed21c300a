"""``model_step.outside_s`` and ``request_added.added_s``: the driver's time between steps.

A driver on a manual clock spends ``PREP_S`` building each prompt before it calls
``add_request`` and ``RESULT_S`` on each step's result; the executor spends ``STEP_S`` a step;
waiting for a later arrival jumps the clock. What these tests prove:
- each step's ``outside_s`` is the driver's work since the previous ``step`` call returned
  (the results handled, the prompts built and added), never the engine's own step time, and
  never a wait for an arrival (the driver says it waits: ``EngineCore.waiting``, in ``drive``);
  the count restarts at the first input after a wait, so that input's own preparation before
  it called in is not seen;
- ``added_s`` is the engine's stamp at each add, one ``PREP_S`` apart within a batch, whatever
  ``arrival_s`` the driver passed;
- both are measurements: the run replays identically (``verify``'s decision comparison).
"""

from __future__ import annotations

import pytest

from engine.batch import ScheduledBatch, StepOutput, StepResult
from engine.config import Config
from engine.drive import drive
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from replay.recorded import from_columns
from replay.verify import verify_recorded
from tracing.sink import MemorySink

PREP_S, RESULT_S, STEP_S = 0.003, 0.0005, 0.010
PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _SteppingExecutor(NullExecutor):
    """The null executor, each step taking ``STEP_S`` on the manual clock."""

    def __init__(self, clock: _Clock, num_kvcache_blocks: int) -> None:
        super().__init__(num_kvcache_blocks)
        self.clock = clock

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        self.clock.now += STEP_S
        return super().execute(batch)


class _Driver:
    """Requests due at ``dues`` (seconds), each prepared for ``PREP_S`` before it is added."""

    def __init__(self, clock: _Clock, dues: list[float]) -> None:
        self.clock, self.dues, self.next = clock, dues, 0

    def feed(self, core: EngineCore, now: float) -> None:
        while self.next < len(self.dues) and self.dues[self.next] <= now:
            self.clock.now += PREP_S
            core.add_request([1 + self.next, 2, 3, 4], PARAMS, arrival_s=self.dues[self.next])
            self.next += 1

    def next_due(self) -> float | None:
        return self.dues[self.next] if self.next < len(self.dues) else None

    def on_result(self, result: StepResult, now: float) -> None:
        self.clock.now += RESULT_S


def _run(dues: list[float]) -> MemorySink:
    clock = _Clock()
    config = Config(num_kvcache_blocks=32, kvcache_block_size=16, max_model_len=128,
                    max_num_batched_tokens=256, async_scheduling=False)
    sink = MemorySink()
    core = EngineCore(config, _SteppingExecutor(clock, 32), sink=sink, header={}, clock=clock)

    def wait_until(due: float) -> None:
        clock.now = max(clock.now, due)

    drive(core, _Driver(clock, dues), lambda: clock.now, wait_until)
    core.close()
    return sink


def test_a_batch_added_at_once_is_one_add_apart_and_its_first_step_holds_the_adds() -> None:
    sink = _run([0.0] * 5)
    added = sink.tables["request_added"]
    gaps = [b - a for a, b in zip(added["added_s"], added["added_s"][1:])]
    assert gaps == pytest.approx([PREP_S] * 4)
    assert added["arrival_s"] == [0.0] * 5  # the driver's times, not the engine's
    outside = sink.tables["model_step"]["outside_s"]
    # Counting starts at the first add (its own preparation came before any call in).
    assert outside[0] == pytest.approx(4 * PREP_S)
    assert outside[1:] == pytest.approx([RESULT_S] * (len(outside) - 1))


def test_a_wait_for_an_arrival_is_not_the_drivers_work() -> None:
    sink = _run([0.0, 5.0])  # the second arrives long after the first has finished
    steps = sink.tables["model_step"]
    after = steps["step"][[i for i, s in enumerate(steps["kind"]) if s == "prefill"][1]]
    outside = steps["outside_s"][after]
    # The last result before the wait, nothing of the 5 s wait, the add not yet prepared.
    assert outside == pytest.approx(RESULT_S)


def test_an_arrival_during_a_step_is_charged_to_the_next() -> None:
    sink = _run([0.0, 0.005])  # due while step 0 runs: added right after it
    steps = sink.tables["model_step"]
    assert steps["outside_s"][1] == pytest.approx(RESULT_S + PREP_S)
    added = sink.tables["request_added"]
    assert added["added_s"][1] == pytest.approx(PREP_S + STEP_S + RESULT_S + PREP_S)
    assert added["step"] == [0, 1]


def test_the_new_columns_are_measurements_not_decisions() -> None:
    sink = _run([0.0, 0.0, 0.005, 5.0])
    result = verify_recorded(from_columns(sink.header, sink.tables))
    assert result.identical, result.divergence
