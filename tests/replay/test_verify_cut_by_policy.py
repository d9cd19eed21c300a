"""What ``verify`` says it checked for a run that died on a policy error in a step that also
added requests.

The step an error cuts is dropped with the requests added for it (``engine/step_cut.py``), so
the trace ends at the step before and ``verify`` can check only that prefix (docs/policies.md).
Its report said "verified the recorded prefix, steps 0 to N" and no more: not that the run's
requests were all still unfinished there, so that nothing of their answers past step N was
checked. It now counts them (docs/trace-format.md says why the cut step's own arrivals are not
in the trace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.policy import PolicyError
from engine.sampling_params import SamplingParams
from replay.cli.main import main
from replay.verify import verify
from tracing.recorder import ParquetRecorder

LATE = """
    from engine.policy import Policy


    class RaisesOnLate(Policy):
        '''Raises when it is offered a request of seq_id 3 or later.'''

        def admit(self, waiting, step):
            if any(seq.seq_id >= 3 for seq in waiting):
                raise RuntimeError("late request")
            yield from super().admit(waiting, step)
"""


def _record(policy: str, trace_dir: Path) -> None:
    """Three requests, two steps, two more requests: the step that offers them raises."""
    config = Config(policy=policy, num_kvcache_blocks=64, kvcache_block_size=4,
                    max_model_len=64, max_num_batched_tokens=256, max_num_seqs=8)
    core = EngineCore(config, NullExecutor(64, vocab_size=100),
                      sink=ParquetRecorder(trace_dir, fsync=False, flush_steps=1),
                      header={"model": {"architecture": "null"}, "device": "cpu: test"})
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    for i in range(3):
        core.add_request([1 + i, 2, 3, 4, 5], params)
    core.step()
    core.step()
    for i in range(2):
        core.add_request([9 + i, 8, 7], params)
    with pytest.raises(PolicyError, match="late request"):
        core.step()
    core.close()


def test_a_run_cut_by_a_policy_error_says_what_verify_did_not_check(
    policy_module, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The trace verifies identical through step 1 (exit 0), the two requests added for the cut
    step are not in it, and the report counts the 3 requests it leaves unfinished."""
    policy = f"{policy_module('late_policy', LATE)}:RaisesOnLate"
    trace_dir = tmp_path / "trace"
    _record(policy, trace_dir)
    from tracing import read_trace

    assert read_trace(trace_dir).table("request_added").num_rows == 3
    result = verify(trace_dir)
    assert result.identical and not result.complete and result.last_step == 1
    report = result.report()
    assert report == (f"identical: {result.num_events} events over 2 steps, 3 of its 3 "
                      "requests unfinished where it ends (incomplete trace: verified the "
                      "recorded prefix, steps 0 to 1)")
    assert main(["verify", str(trace_dir)]) == 0
    assert capsys.readouterr().out.strip() == report
