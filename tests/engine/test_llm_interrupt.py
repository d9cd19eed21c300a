"""``LLM`` stopped before its run finished: Ctrl-C (``KeyboardInterrupt``) or another exception
in a ``with LLM(...)`` block, or in ``generate`` and then ``close()``.

Before: ``__exit__`` (and a later ``close()``) closed normally and wrote the summary, so a prefix
of the run read as a *complete* trace of a smaller workload (``verify``: "identical", nothing
said about it being incomplete), and a Ctrl-C landing mid-step committed half a step. Now the
trace is left incomplete (``close(interrupted=True)``), the step the exception cut is dropped
(``engine/step_cut.py``) and every whole step before it is committed and verifies.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import LLM, SamplingParams
from engine.errors import EngineClosedError
from replay.verify import verify
from tracing.layout import SUMMARY_FILE
from tracing.reader import read_trace

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
CUT = 3  # the step the exception lands in


def _engine(trace: Path, overlap: bool = True) -> LLM:
    return LLM(None, trace_dir=str(trace), calibration_repeats=0, trace_flush_steps=1,
               max_num_seqs=2, async_scheduling=overlap)


def _raise_on(target: Any, names: str, exc: type[BaseException], after: bool = False) -> None:
    """Make the methods ``names`` (space-separated, one count) of ``target`` raise ``exc`` in
    their call for step ``CUT`` (``after``: once the original returned)."""
    calls = iter(range(10**6))

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def cut(*args: Any, **kwargs: Any) -> Any:
            index = next(calls)
            if index == CUT and not after:
                raise exc
            out = original(*args, **kwargs)
            if index == CUT:
                raise exc
            return out

        return cut

    for name in names.split():
        setattr(target, name, wrap(getattr(target, name)))


def _assert_whole_prefix(trace: Path, through: int, overlap: bool = False) -> None:
    """No summary; steps 0 to ``through`` committed whole, verify passes and says the trace is
    incomplete. Sequential steps: nothing of a later step, event ids without a gap. Overlapped
    ones: the step in flight when the exception came is dropped too (its tokens were never
    back), so the prefix may end one step earlier; the next step's first rows may be in the
    last segment, as in any overlapped recording stopped there, past ``last_step``."""
    assert not (trace / SUMMARY_FILE).exists()
    got = read_trace(trace)
    assert not got.complete
    assert got.last_step == through or (overlap and got.last_step == through - 1), got.last_step
    through = got.last_step
    steps = [s for s in got.table("model_step").column("step").to_pylist() if s <= through]
    assert steps == list(range(through + 1))
    if not overlap:
        assert steps == got.table("model_step").column("step").to_pylist() == got.table(
            "batch_scheduled").column("step").to_pylist()
        assert max(got.events().column("step").to_pylist()) <= through
        ids = np.sort(got.events().column("event_id").to_numpy())
        assert ids.tolist() == list(range(got.num_events))
    result = verify(trace)
    assert result.identical and not result.complete, result.report()
    assert result.last_step == through and "incomplete trace" in result.report()


# Where Ctrl-C lands in step CUT: before the model runs (its batch's events emitted; an
# overlapped step's predecessor still in flight), after its tokens are post-processed (its step
# counter not yet moved): the step is dropped. Inside the recorder's step end: its events were
# final, it is kept.
WHERE = {
    "model": lambda llm: _raise_on(llm.runner, "launch" if llm.core._async else "execute",
                                   KeyboardInterrupt),
    "postprocess": lambda llm: _raise_on(llm.core.scheduler, "postprocess postprocess_pending",
                                         KeyboardInterrupt, after=True),
    "sink": lambda llm: _raise_on(llm.sink, "on_step_end", KeyboardInterrupt),
}
THROUGH = {"model": CUT - 1, "postprocess": CUT - 1, "sink": CUT}


@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "sequential"])
@pytest.mark.parametrize("where", list(WHERE))
def test_ctrl_c_mid_step_in_a_with_block_leaves_whole_steps_and_no_summary(
        tmp_path: Path, where: str, overlap: bool) -> None:
    trace = tmp_path / "t"
    with pytest.raises(KeyboardInterrupt):
        with _engine(trace, overlap) as llm:
            WHERE[where](llm)
            llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    _assert_whole_prefix(trace, THROUGH[where], overlap)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, RuntimeError])
def test_an_exception_leaving_the_with_block_leaves_the_trace_incomplete(
        tmp_path: Path, exc: type[BaseException]) -> None:
    """Between two ``generate`` calls too: the program did not finish its run."""
    trace = tmp_path / "t"
    with pytest.raises(exc):
        with _engine(trace) as llm:
            llm.generate(PROMPTS, PARAMS, use_tqdm=False)
            steps = llm.core.step_index
            raise exc
    _assert_whole_prefix(trace, steps - 1)


def test_a_with_block_that_ends_normally_writes_the_summary(tmp_path: Path) -> None:
    trace = tmp_path / "t"
    with _engine(trace) as llm:
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert read_trace(trace).complete and verify(trace).identical


def test_generate_cut_mid_step_then_close_leaves_the_trace_incomplete(tmp_path: Path) -> None:
    """Without a ``with``: the engine refuses to go on after a cut step (its scheduler stopped
    mid-decision), and ``close()`` leaves the trace incomplete without being told."""
    trace = tmp_path / "t"
    llm = _engine(trace)
    WHERE["model"](llm)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    with pytest.raises(EngineClosedError, match="was cut short by an exception"):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    llm.close()
    _assert_whole_prefix(trace, CUT - 1, overlap=True)


def test_generate_stopped_between_steps_then_close_leaves_the_trace_incomplete(
        tmp_path: Path) -> None:
    """Ctrl-C outside a step (the progress bar, detokenizing): every step is whole, but the
    requests never finished; ``close()`` leaves the trace incomplete. A later ``generate`` that
    returns runs the leftover requests too, and then the trace is whole again."""
    trace = tmp_path / "t"
    llm = _engine(trace)
    _raise_on(llm.core, "step", KeyboardInterrupt, after=True)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    llm.close()
    _assert_whole_prefix(trace, CUT)

    again = tmp_path / "again"
    llm = _engine(again)
    _raise_on(llm.core, "step", KeyboardInterrupt, after=True)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert len(llm.generate([[1, 2]], PARAMS, use_tqdm=False)) == 1
    llm.close()
    assert read_trace(again).complete and verify(again).identical
