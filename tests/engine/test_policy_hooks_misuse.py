"""Session 33: user policies wrong in the ways users get them wrong, through ``run_workload``.

What these tests prove: a hook that calls ``sys.exit()`` (a leftover debugging exit, a library
exiting) is the ``policy`` violation naming the policy and the hook, not an exit of the whole
process with no message; a hook that takes seconds per call warns once, naming the policy, the
hook and the time, instead of stretching a property run silently; a policy module that cannot be
found says where it was looked for and how to make it importable; a module name that resolves to
another module (the standard library's ``random``) names the file that was imported.
"""

from __future__ import annotations

import warnings

import pytest

from engine.config import Config
from engine.errors import ConfigError
from engine.policy import Step, make_policy, policy_class
from engine.policy_guard import GuardedPolicy, PolicyError, PolicySlowWarning
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from replay.testing import RequestSpec, Workload, run_workload

EXITS = """
    import sys

    from engine.policy import Policy


    class ExitsInAdmit(Policy):
        def admit(self, waiting, step):
            sys.exit(3)


    class ExitsInGenerator(Policy):
        def admit(self, waiting, step):
            yield waiting[0]
            raise SystemExit("bye")


    class ExitsInChunk(Policy):
        mixed_batches = True

        def chunk(self, seq, remaining, step):
            raise SystemExit
"""

SLOW = """
    import time

    from engine.policy import Policy


    class SlowFirstAdmit(Policy):
        def __init__(self, config):
            super().__init__(config)
            self.calls = 0

        def admit(self, waiting, step):
            self.calls += 1
            if self.calls == 1:
                time.sleep(SLEEP)
            yield from super().admit(waiting, step)
"""


def _workload(policy: str) -> Workload:
    config = Config(policy=policy, kvcache_block_size=2, num_kvcache_blocks=8, max_model_len=16,
                    max_num_batched_tokens=16, eos=-1)
    return Workload(config, (RequestSpec(0, (1, 2, 3), 2, True, (3, 3)),
                             RequestSpec(1, (4, 5), 2, True, (3, 3))))


@pytest.mark.parametrize(("cls", "hook", "raised"), [
    ("ExitsInAdmit", "admit", "SystemExit: 3"),
    ("ExitsInGenerator", "admit", "SystemExit: bye"),
    ("ExitsInChunk", "chunk", "SystemExit"),
])
def test_a_hook_calling_sys_exit_is_the_policy_violation(policy_module, cls, hook,
                                                         raised) -> None:
    """SystemExit out of a hook is the ``policy`` property's one line naming the policy, the
    exception and the hook; before, it ended the test process (the CLI exited 3, no message)."""
    module = policy_module("exiting_policy", EXITS)
    run = run_workload(_workload(f"{module}:{cls}"))
    (line,) = run.violations["policy"]
    assert f"policy '{module}:{cls}' raised {raised}" in line
    assert line.endswith(f"in {hook}") or f" in {hook}" in line


def test_a_slow_hook_warns_naming_the_policy_the_hook_and_the_time(policy_module,
                                                                    monkeypatch) -> None:
    """One admit call over the limit (``engine.policy_guard.SLOW_HOOK_S``) warns once with the
    policy's import path, the hook and the seconds it took; the run's result is unchanged."""
    import engine.policy_guard as guard

    monkeypatch.setattr(guard, "SLOW_HOOK_S", 0.05)
    module = policy_module("slow_policy_a", SLOW.replace("SLEEP", "0.12"))
    with pytest.warns(PolicySlowWarning) as caught:
        run = run_workload(_workload(f"{module}:SlowFirstAdmit"))
    assert not run.violations
    (warning,) = [w for w in caught if issubclass(w.category, PolicySlowWarning)]
    text = str(warning.message)
    assert f"policy '{module}:SlowFirstAdmit'" in text and " admit " in text
    assert "slow_policy_a.py" in text
    seconds = float(text.split(" took ")[1].split(" s")[0])
    assert seconds >= 0.1


def test_a_fast_policy_never_warns(policy_module, monkeypatch) -> None:
    """The same policy with no sleep stays under the limit: no warning (the check can pass)."""
    import engine.policy_guard as guard

    monkeypatch.setattr(guard, "SLOW_HOOK_S", 0.05)
    module = policy_module("slow_policy_b", SLOW.replace("SLEEP", "0"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PolicySlowWarning)
        run = run_workload(_workload(f"{module}:SlowFirstAdmit"))
    assert not run.violations


def test_a_missing_module_says_how_to_make_it_importable() -> None:
    """``cannot import ...: No module named ...`` now says where it was looked for and to put
    the policy's directory on PYTHONPATH (the message ``verify`` of a trace recorded elsewhere
    shows)."""
    with pytest.raises(ConfigError) as failure:
        policy_class("no_such_policy_module_q:P")
    text = str(failure.value)
    assert "No module named 'no_such_policy_module_q'" in text
    assert "PYTHONPATH" in text and "working directory" in text


def test_a_module_shadowed_by_another_names_the_file_imported() -> None:
    """``random:MyPolicy`` imports the standard library's random, not ./random.py: the error
    names the file it found, so the shadowing is visible."""
    import random

    with pytest.raises(ConfigError) as failure:
        policy_class("random:MyPolicy")
    assert random.__file__ in str(failure.value)
    assert "MyPolicy" in str(failure.value)


SJF = """
    from engine.policy import Policy


    class ShortestJobFirst(Policy):
        pass


    helper = 3
"""


@pytest.mark.parametrize("path", ["{m}.py:ShortestJobFirst", "./{m}.py:ShortestJobFirst",
                                  "{dir}/{m}.py:ShortestJobFirst"])
def test_a_file_path_for_the_module_says_to_name_the_module(policy_module, tmp_path,
                                                             path) -> None:
    """``sjf.py:X`` or a path to the file (what a shell user types) is one line saying to name
    the module, ``sjf:X``; it read "No module named 'sjf.py'; 'sjf' is not a package" or "the
    'package' argument is required to perform a relative import"."""
    module = policy_module("sjf_by_path", SJF)
    name = path.format(m=module, dir=tmp_path)
    with pytest.raises(ConfigError) as failure:
        policy_class(name)
    text = str(failure.value)
    assert f"name the module, not its file: {module}:ShortestJobFirst" in text
    assert "not a package" not in text and "relative import" not in text


def test_a_missing_class_lists_the_policies_the_module_defines(policy_module) -> None:
    """A misspelt class name says the module defines no such name and lists its Policy
    subclasses (was: "... is not a subclass of engine.policy.Policy"); a name that exists but
    is no Policy subclass still says so."""
    module = policy_module("sjf_misspelt", SJF)
    with pytest.raises(ConfigError) as failure:
        policy_class(f"{module}:ShortestJobFrist")
    text = str(failure.value)
    assert f"{module} (" in text and "defines no ShortestJobFrist;" in text
    assert "its Policy subclasses: ShortestJobFirst" in text
    with pytest.raises(ConfigError, match="helper is not a subclass of engine.policy.Policy"):
        policy_class(f"{module}:helper")


TWICE = """
    from engine.policy import Policy


    class AdmitsTwice(Policy):
        def admit(self, waiting, step):
            return [waiting[0], waiting[0]]
"""


def test_admitting_a_sequence_twice_says_twice(policy_module) -> None:
    """``admit`` answering the same waiting sequence twice in a step is one line saying so;
    it read "admitted seq 0, which is not waiting" while the policy had just been offered it."""
    module = policy_module("admits_twice", TWICE)
    run = run_workload(_workload(f"{module}:AdmitsTwice"))
    (line,) = run.violations["policy"]
    assert f"policy '{module}:AdmitsTwice' admitted seq 0 twice in one admit call" in line


COPIES = """
    import copy

    from engine.policy import Policy


    class AdmitsCopies(Policy):
        def admit(self, waiting, step):
            return [copy.copy(seq) for seq in waiting][:1]


    class PreemptsACopy(Policy):
        def victim(self, candidates, step):
            return copy.deepcopy(candidates[-1])
"""


def test_answering_with_a_copy_of_a_sequence_says_it_is_a_copy(policy_module) -> None:
    """A view copied (``copy.copy``/``deepcopy``: a detached snapshot) and given back is named
    as a copy of its sequence; it read "admitted seq 0, which is not one of the waiting
    sequences offered" while seq 0 was waiting."""
    module = policy_module("answers_copies", COPIES)
    run = run_workload(_workload(f"{module}:AdmitsCopies"))
    (line,) = run.violations["policy"]
    assert "admitted a copy of seq 0 (" in line and "answer with the sequence offered" in line

    config = Config(policy=f"{module}:PreemptsACopy", kvcache_block_size=2,
                    num_kvcache_blocks=8, max_model_len=16, max_num_batched_tokens=16)
    guarded = make_policy(config)
    assert isinstance(guarded, GuardedPolicy)
    params = SamplingParams(max_tokens=2)
    seqs = [Sequence(0, [1, 2, 3], params), Sequence(1, [4, 5], params)]
    step = Step(16, 4, lambda: 0, lambda s: False, lambda s: 0)
    with pytest.raises(PolicyError, match=r"chose a copy of seq \d+ \(.*\) to preempt"):
        guarded.victim(seqs, step)


def test_arguments_in_the_import_path_say_a_policy_takes_none(policy_module) -> None:
    """``sjf:ShortestJobFirst(alpha=2)`` (a user passing a setting) says a policy is built with
    the Config alone and how to give it a setting; it read "defines no ShortestJobFirst(alpha=2)"
    or "is not a subclass"."""
    module = policy_module("sjf_with_args", SJF)
    with pytest.raises(ConfigError) as failure:
        policy_class(f"{module}:ShortestJobFirst(alpha=2)")
    text = str(failure.value)
    assert "a policy takes no arguments" in text and "class attribute" in text
