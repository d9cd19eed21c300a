"""A user's honest mistakes while testing a policy of their own with replay.testing.

- A policy whose ``eviction_key`` raises only for a block an abort releases: ``run_workload``
  let the ``PolicyError`` out of its ``core.abort`` call (a traceback out of the test helper,
  no ``policy`` violation, no rebuild code, the events so far unchecked) where the same error in
  a step is the documented ``policy`` violation. It is that violation now, sequential and
  overlapped alike.
- ``workloads(policies=(MyPolicy,))``, the class where its import path belongs, was an
  ``AttributeError: type object 'MyPolicy' has no attribute 'partition'`` from deep inside the
  strategy; it is one ``ConfigError`` line naming the import path to give.
- ``pytest --hypothesis-profile=Deep`` (a misspelt profile) was an INTERNALERROR and a page of
  traceback from Hypothesis's plugin, exit 3; it is one usage-error line listing the registered
  profiles, exit 4, as ``HYPOTHESIS_PROFILE=Deep`` already was.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from test_profile_env_names import user_pytest

from engine.config import Config
from engine.errors import ConfigError
from engine.policy import Policy, policy_class
from replay.testing import RequestSpec, Workload, run_workload, workloads

REPO = Path(__file__).resolve().parents[3]

POLICIES = """
    from engine.policy import Policy


    class EvictOnAbort(Policy):
        '''Ranks blocks by release, but fails on a block released while its sequence was still
        producing (uncached, used after step 0): only an abort releases one here.'''

        def eviction_key(self, block):
            if block.last_used >= 1 and not block.cached:
                raise KeyError("no rank for an aborted block")
            return block.released
"""


@pytest.fixture
def module(policy_module) -> str:
    return policy_module("s38_abort_policy", POLICIES)


def _aborted_mid_run(policy: str) -> Workload:
    config = Config(policy=policy, num_kvcache_blocks=20, kvcache_block_size=4, max_model_len=32,
                    max_num_batched_tokens=32, max_num_seqs=3, eos=-1, hash_seed=0)
    return Workload(config, (RequestSpec(arrival_step=0, prompt=(1, 2, 3), max_tokens=20,
                                         ignore_eos=True, script=(2,) * 20, abort_step=3),))


@pytest.mark.parametrize("overlap", [False, True])
def test_a_policy_failing_in_an_abort_is_the_policy_violation(module, overlap) -> None:
    workload = _aborted_mid_run(f"{module}:EvictOnAbort")
    run = run_workload(workload, overlap=overlap, observe=not overlap)  # raised PolicyError
    (message,) = run.violations["policy"]
    assert message.startswith("abort of seq 0 at step ")
    assert "raised KeyError: 'no rank for an aborted block' (s38_abort_policy.py:" in message
    assert message.endswith("in eviction_key")
    with pytest.raises(AssertionError, match="properties violated: .*policy"):
        run.raise_violations()


def test_the_same_workload_under_a_correct_policy_has_no_violation() -> None:
    # The workload does abort mid-run: the failure above is the policy's, not the driver's.
    run = run_workload(_aborted_mid_run("prefill_first"))
    assert run.violations == {} and run.aborted == {0}


class Inline(Policy):
    """A policy given as a class object."""


def test_a_policy_class_where_its_import_path_belongs_says_which_path() -> None:
    with pytest.raises(ConfigError) as caught:
        policy_class(Inline)  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"policy {Inline!r}: give a policy by its import path as a string, "
        f"'{__name__}:Inline', not the class")

    for policies in ((Inline,), Inline):
        @settings(max_examples=1, database=None)
        @given(workloads(policies=policies))  # type: ignore[arg-type]
        def test(workload: Workload) -> None:
            run_workload(workload).raise_violations()

        with pytest.raises(ConfigError, match="give a policy by its import path as a string"):
            test()  # was AttributeError: type object 'Inline' has no attribute 'partition'


def test_a_misspelt_profile_option_is_a_usage_error_naming_the_profiles(tmp_path: Path) -> None:
    done = user_pytest(tmp_path, "--hypothesis-profile=Deep")
    output = done.stdout + done.stderr
    assert done.returncode == 4, output[-2000:]  # was 3, INTERNALERROR and a traceback
    assert "--hypothesis-profile='Deep' names no registered Hypothesis profile" in output
    assert "(registered: ci, deep, default, dev;" in output
    assert "Traceback" not in output and "INTERNALERROR" not in output
    assert "PROFILE" not in done.stdout  # no test ran


def test_the_profile_option_still_loads_shipped_and_conftest_profiles(tmp_path: Path) -> None:
    done = user_pytest(tmp_path, "--hypothesis-profile=dev")
    assert done.returncode == 0 and "PROFILE dev 10" in done.stdout, done.stdout[-2000:]
    conftest = ("from hypothesis import settings\n"
                "settings.register_profile('nightly', max_examples=7, deadline=None)\n")
    done = user_pytest(tmp_path, "--hypothesis-profile=nightly", conftest=conftest)
    assert done.returncode == 0 and "PROFILE nightly 7" in done.stdout, done.stdout[-2000:]
