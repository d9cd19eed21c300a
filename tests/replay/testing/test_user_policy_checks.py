"""A user's policy tests (session 31): what ``run_workload`` must catch and what the documented
workflow needs from the public API.

- A policy that decides otherwise on a second run from the same state (state kept across
  instances, randomness, the clock) passed every property of ``run_workload``; its traces fail
  ``verify``. It is the ``replay`` property now, with the first divergence in one line.
- The engine asked a user policy's ``admit`` with nothing waiting (idle steps between arrivals,
  the replay's last step), so a policy that counts its calls (a step clock, aging) saw other
  counts live and in replay and its recording diverged. The guard no longer asks it then.
- docs/policies.md says an overlapped and a sequential run of one workload must record equal
  event streams; their raw tables differ in measured columns, and the comparison the project's
  own tests use was not public. ``Run.decisions()`` is that comparison.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings

from engine.config import Config
from replay.testing import PropertyViolations, RequestSpec, Workload, run_workload, workloads
from replay.testing.strategies import scaled

POLICIES = """
    from engine.policy import Policy


    class Flip(Policy):
        '''Every other instance admits newest first: the replay's instance decides otherwise.'''

        instances = 0

        def __init__(self, config):
            super().__init__(config)
            Flip.instances += 1
            self.reverse = Flip.instances % 2 == 0

        def admit(self, waiting, step):
            order = list(waiting)[::-1] if self.reverse else list(waiting)
            for seq in order:
                if seq.num_tokens > step.tokens_left:
                    return
                yield seq


    class CallClock(Policy):
        '''Counts its admit calls as its clock: newest first on odd calls.'''

        def __init__(self, config):
            super().__init__(config)
            self.calls = []

        def admit(self, waiting, step):
            self.calls.append(len(waiting))
            order = list(waiting)[::-1] if len(self.calls) % 2 else list(waiting)
            for seq in order:
                if seq.num_tokens > step.tokens_left:
                    return
                yield seq


    class RaisesInReplay(Policy):
        '''Every other instance raises: the replay's.'''

        instances = 0

        def __init__(self, config):
            super().__init__(config)
            RaisesInReplay.instances += 1
            self.fails = RaisesInReplay.instances % 2 == 0

        def admit(self, waiting, step):
            if self.fails:
                raise KeyError("replay")
            yield from super().admit(waiting, step)


    class Fifo(Policy):
        '''prefill_first, as an import path (guarded).'''
"""


@pytest.fixture
def module(policy_module) -> str:
    return policy_module("user_checks_policy", POLICIES)


def _two_at_once(policy: str) -> Workload:
    config = Config(policy=policy, num_kvcache_blocks=8, kvcache_block_size=2, max_model_len=12,
                    max_num_batched_tokens=12, max_num_seqs=1, eos=-1)
    return Workload(config, tuple(
        RequestSpec(arrival_step=0, prompt=(i, 1, 2), max_tokens=2, ignore_eos=True,
                    script=(3, 4)) for i in range(2)))


def test_a_policy_that_decides_otherwise_on_replay_fails_the_replay_property(module) -> None:
    run = run_workload(_two_at_once(f"{module}:Flip"))
    assert list(run.violations) == ["replay"], run.violations
    with pytest.raises(PropertyViolations) as failure:
        run.raise_violations()
    text = str(failure.value)
    assert "properties violated: replay" in text
    assert "does not replay identically (diverged at event" in text
    assert "replay stopped:" in text and "rebuild it: Workload(" in text
    # and the same workload under a deterministic policy replays
    assert not run_workload(_two_at_once(f"{module}:Fifo")).violations
    assert not run_workload(_two_at_once(f"{module}:Flip"), replay=False).violations


def test_generated_workloads_find_it(module) -> None:
    @settings(max_examples=scaled(0.2), database=None, phases=(Phase.generate,))
    @given(workloads(policies=(f"{module}:Flip",)))
    def test(workload):
        run_workload(workload).raise_violations()

    with pytest.raises(PropertyViolations, match="properties violated: replay"):
        test()


def test_overlapped_and_sequential_runs_compare_by_their_decisions(module) -> None:
    workload = _two_at_once(f"{module}:Fifo")
    sequential = run_workload(workload)
    overlapped = run_workload(workload, overlap=True, observe=False)
    sequential.raise_violations()
    overlapped.raise_violations()
    assert sequential.sink.tables["model_step"] != overlapped.sink.tables["model_step"]
    assert overlapped.decisions() == sequential.decisions()
    assert set(sequential.decisions()["model_step"]) >= {"step", "overlapped"}


def test_a_policy_counting_its_calls_is_asked_only_with_something_waiting(module) -> None:
    from engine.engine_core import EngineCore
    from replay.testing.run import ScriptedExecutor
    from replay.testing.scripted import Run

    config = Config(policy=f"{module}:CallClock", num_kvcache_blocks=8, kvcache_block_size=2,
                    max_model_len=12, max_num_batched_tokens=12, max_num_seqs=1, eos=-1)
    first = RequestSpec(arrival_step=0, prompt=(5, 1), max_tokens=1, ignore_eos=True, script=(3,))
    later = tuple(RequestSpec(arrival_step=2, prompt=(i, 1, 2), max_tokens=2, ignore_eos=True,
                              script=(3, 4)) for i in range(2))
    workload = Workload(config, (first, *later))
    run = run_workload(workload)  # an idle step between the arrivals
    assert not run.violations, run.violations
    assert 0 not in run.core.scheduler.policy.inner.calls
    # an engine stepped with nothing queued does not ask the policy
    core = EngineCore(config, ScriptedExecutor(config, Run(workload)))
    assert core.step() is None and core.scheduler.policy.inner.calls == []
    core.close()


def test_a_policy_raising_only_in_the_replay_is_the_replay_violation(module) -> None:
    """It was the PolicyError out of ``run_workload`` itself (a traceback through the replayer)."""
    run = run_workload(_two_at_once(f"{module}:RaisesInReplay"))
    assert list(run.violations) == ["replay"], run.violations
    assert run.violations["replay"][0].startswith(
        f"the recording cannot be replayed: policy '{module}:RaisesInReplay' raised KeyError")
