"""Session 36: a failing user policy's workload shrinks to a small example.

What these tests prove: the ``workloads`` strategy is shaped for Hypothesis's shrinker. A policy
that fails on any prompt of 7 tokens or more is reported with the minimal workload, one request
of a 7-token prompt under ``max_model_len`` 7 (the edge values 12, 16, 24 and 32 were the first
branch of its ``one_of``, so the example stopped at 12, never at the length that fails); and
a policy that fails with three requests waiting is reported with exactly three requests, each
one request drawn as one span of choices that the shrinker deletes whole (a count drawn first
and the prompts, then the rest of each request, in separate loops made a deletion shift every
later choice: 412 of 642 shrink attempts were invalid, and shrinking took minutes).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from replay.testing import PropertyViolations, Workload, run_workload, workloads

LONG_PROMPT = """
    from engine.policy import Policy


    class FailsOnLong(Policy):
        '''Raises when a prompt of 7 tokens or more waits.'''

        def admit(self, waiting, step):
            if any(seq.num_prompt_tokens >= 7 for seq in waiting):
                raise RuntimeError("long prompt")
            yield from super().admit(waiting, step)


    class FailsOnThree(Policy):
        '''Raises when three requests wait at once.'''

        def admit(self, waiting, step):
            if len(waiting) >= 3:
                raise RuntimeError("three waiting")
            yield from super().admit(waiting, step)
"""


def _shrunk(policy: str) -> Workload:
    """The workload Hypothesis reports for ``policy`` (the last failing one it ran: the
    shrunk example is replayed last)."""
    failing: list[Workload] = []

    @settings(max_examples=100, derandomize=True, database=None, deadline=None)
    @given(workloads(policies=(policy,)))
    def test(workload):
        run = run_workload(workload, replay=False)
        if run.violations:
            failing.append(workload)
        run.raise_violations()

    with pytest.raises(PropertyViolations):
        test()
    return failing[-1]


def test_a_failure_on_prompt_length_shrinks_to_that_length(policy_module) -> None:
    """One request, a 7-token prompt of zeros, ``max_model_len`` 7 and as few blocks as it
    needs: the smallest workload on which the policy fails."""
    module = policy_module("fails_on_long", LONG_PROMPT)
    workload = _shrunk(f"{module}:FailsOnLong")
    (request,) = workload.requests
    assert request.prompt == (0,) * 7
    assert workload.config.max_model_len == 7
    assert request.max_tokens == 1


def test_a_failure_needing_three_requests_keeps_three(policy_module) -> None:
    """Exactly three requests, each the simplest one (one token, one output)."""
    module = policy_module("fails_on_three", LONG_PROMPT)
    workload = _shrunk(f"{module}:FailsOnThree")
    assert len(workload.requests) == 3
    assert all(len(r.prompt) == 1 and r.max_tokens == 1 for r in workload.requests)
