"""A run that a violation stops (a policy that raises mid-run) reports that violation, not
also a ``completion`` one for each request the stop left unfinished: those are its consequence,
and they hid the cause (``completion: seq 3: request_finished rows None``, three lines of it,
sorted before ``policy`` in the report). A run that ends normally still checks completion."""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import Config
from replay.testing import RequestSpec, Workload, run_workload

POLICIES = """
    from engine.policy import Policy


    class RaisesLater(Policy):
        '''Admits once, then raises in admit: requests are left unfinished.'''

        def __init__(self, config):
            super().__init__(config)
            self.calls = 0

        def admit(self, waiting, step):
            self.calls += 1
            if self.calls > 1:
                raise KeyError("oops")
            yield from super().admit(waiting, step)


    class WrongFirstToken(Policy):
        '''A plain policy: the run ends normally (the test breaks a script afterwards).'''
"""


def _workload(policy: str) -> Workload:
    config = Config(policy=policy, kvcache_block_size=2, num_kvcache_blocks=16,
                    max_model_len=16, max_num_batched_tokens=16, max_num_seqs=4)
    # two requests start; the next two arrive while they decode, and admitting them raises
    requests = tuple(RequestSpec(step, (1, 2, 3), 4, True, (5, 6, 7, 8))
                     for step in (0, 0, 2, 2))
    return Workload(config, requests)


@pytest.fixture
def module(policy_module) -> str:
    return policy_module("stopping_policy", POLICIES)


def test_a_policy_stop_reports_the_policy_and_not_the_unfinished_requests(module: str) -> None:
    """Before: violations were ``completion`` (one per unfinished request) and ``policy``;
    now only ``policy``, naming the exception."""
    run = run_workload(_workload(f"{module}:RaisesLater"))
    assert list(run.violations) == ["policy"], run.violations
    assert "raised KeyError: 'oops'" in run.violations["policy"][0]
    unfinished = [sid for sid, (_, seq) in run.seqs.items() if not seq.is_finished]
    assert unfinished, "the workload must leave requests unfinished to prove anything"


def test_a_run_that_ends_normally_still_checks_completion(module: str) -> None:
    """A request whose tokens differ from its script in a run that was not stopped is still a
    ``completion`` violation: the stop exemption does not switch the check off."""
    workload = _workload(f"{module}:WrongFirstToken")
    run = run_workload(workload)
    assert run.violations == {}
    spec, seq = run.seqs[0]
    # as if the engine had returned other tokens than the script's (the expectation changed)
    run.seqs[0] = (dataclasses.replace(spec, script=(9, 6, 7, 8)), seq)
    from replay.testing.run import _check_outcome

    _check_outcome(run)
    assert "completion" in run.violations and "seq 0" in run.violations["completion"][0]


def test_an_unfinished_request_of_a_stopped_run_still_checks_its_tokens_so_far(
        module: str) -> None:
    """The tokens a stopped request did get must still be its script's prefix: a wrong one is
    a ``completion`` violation, not hidden by the stop."""
    run = run_workload(_workload(f"{module}:RaisesLater"))
    partial = [(sid, seq) for sid, (_, seq) in run.seqs.items()
               if not seq.is_finished and seq.completion_token_ids]
    assert partial, "the workload must leave a request with some tokens"
    sid, seq = partial[0]
    spec = run.seqs[sid][0]
    run.seqs[sid] = (dataclasses.replace(spec, script=(9, 6, 7, 8)), seq)
    from replay.testing.run import _check_outcome

    _check_outcome(run)
    assert any(f"seq {sid}" in m for m in run.violations.get("completion", [])), run.violations
