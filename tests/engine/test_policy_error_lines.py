"""A policy's error names the policy's own line, and says what was meant.

What these tests prove (docs/policies.md: the ``PolicyError`` line carries "the file and line of
the policy's code"):

- ``step.priority(seq.seq_id)`` / ``step.can_allocate(seq.seq_id)`` (an id where the sequence
  belongs) was ``AttributeError: 'int' object has no attribute 'priority' (scheduler.py:161)``:
  an engine file and line, as if the engine were broken. It is a ``TypeError`` saying what
  ``step.priority`` takes, at the policy's line.
- A policy failing inside the standard library (``statistics.mean([])``) or in the engine code
  its view reads through (``seq.block(...)`` with wrong arguments) was located there
  (``statistics.py:...``, ``sequence.py:...``); it is located at the policy's line, and a helper
  module of the user's own keeps its own line.
- A misspelt field or name (``seq.num_token``, ``step.token_left``, ``waitng``) lost the "Did
  you mean" Python's own traceback gives; the line says it.
"""

from __future__ import annotations

import pytest
from _policy_runs import policy_violation

HELPERS = """
    def rank(seq):
        raise LookupError("no rank for seq %d" % seq.seq_id)
"""

POLICIES = """
    import statistics

    from engine.policy import Policy
    from s38_guard_helpers import rank


    class PriorityById(Policy):
        def admit(self, waiting, step):
            for seq in sorted(waiting, key=lambda s: step.priority(s.seq_id)):  # line 10
                yield seq


    class CanAllocateById(Policy):
        def admit(self, waiting, step):
            for seq in waiting:
                if step.can_allocate(seq.seq_id):  # line 17
                    yield seq


    class StdlibRaises(Policy):
        def admit(self, waiting, step):
            statistics.mean([s.num_tokens for s in waiting if s.num_tokens > 99])  # line 23
            yield from super().admit(waiting, step)


    class ViewMethodMisused(Policy):
        def admit(self, waiting, step):
            waiting[0].block("0", 2)  # line 29
            yield from super().admit(waiting, step)


    class HelperRaises(Policy):
        def admit(self, waiting, step):
            yield from sorted(waiting, key=rank)


    class FieldTypo(Policy):
        def admit(self, waiting, step):
            for seq in sorted(waiting, key=lambda s: s.num_token):
                yield seq


    class StepTypo(Policy):
        def admit(self, waiting, step):
            for seq in waiting:
                if seq.num_tokens <= step.token_left:
                    yield seq


    class NameTypo(Policy):
        def admit(self, waiting, step):
            yield from super().admit(waitng, step)
"""


@pytest.fixture
def module(policy_module) -> str:
    policy_module("s38_guard_helpers", HELPERS)
    return policy_module("s38_guard_policy", POLICIES)


@pytest.mark.parametrize(("cls", "method", "line"), [
    ("PriorityById", "priority", 10), ("CanAllocateById", "can_allocate", 17)])
def test_a_step_method_given_an_id_says_what_it_takes_at_the_policys_line(
        module, cls, method, line) -> None:
    message = policy_violation(f"{module}:{cls}")
    assert (f"raised TypeError: step.{method}(seq) takes a sequence offered to the hook, got 0 "
            f"(int) (s38_guard_policy.py:{line}) in admit") in message, message


@pytest.mark.parametrize(("cls", "raised", "line"), [
    ("StdlibRaises", "StatisticsError: mean requires at least one data point", 23),
    ("ViewMethodMisused", 'TypeError: can only concatenate str (not "int") to str', 29)])
def test_a_failure_inside_library_or_engine_code_is_located_at_the_policys_line(
        module, cls, raised, line) -> None:
    message = policy_violation(f"{module}:{cls}")
    assert f"raised {raised} (s38_guard_policy.py:{line}) in admit" in message, message


def test_a_failure_in_a_users_helper_module_keeps_the_helpers_line(module) -> None:
    message = policy_violation(f"{module}:HelperRaises")
    assert "raised LookupError: no rank for seq 0 (s38_guard_helpers.py:3) in admit" in message


@pytest.mark.parametrize(("cls", "raised"), [
    ("FieldTypo", "AttributeError: 'SequenceView' object has no attribute 'num_token'. Did you "
                  "mean: 'num_tokens'?"),
    ("StepTypo", "AttributeError: 'StepView' object has no attribute 'token_left'. Did you "
                 "mean: 'tokens_left'?"),
    ("NameTypo", "NameError: name 'waitng' is not defined. Did you mean: 'waiting'?")])
def test_a_misspelt_field_or_name_says_which_was_meant(module, cls, raised) -> None:
    message = policy_violation(f"{module}:{cls}")
    assert f"raised {raised} (s38_guard_policy.py:" in message, message
