"""Session 33: what a user reads when their policy's property fails.

What these tests prove: Hypothesis's own "Failing test case" block prints the shrunk workload as
the short code that rebuilds it (the ``rebuild it:`` lines), not the dataclass dump of all of
``Config``'s fields (model, kernels, GC: some 60 lines a policy test never sets); and that code
rebuilds the workload, also one with Config fields the strategies never draw.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings
from hypothesis.vendor.pretty import pretty

from engine.config import Config
from replay.testing import PropertyViolations, RequestSpec, Workload, run_workload, workloads

STARVES = """
    from engine.policy import Policy


    class ShortOnly(Policy):
        def admit(self, waiting, step):
            for seq in waiting:
                if seq.num_tokens <= 8 and seq.num_tokens <= step.tokens_left:
                    yield seq
"""


def _rebuilt(code: str) -> Workload:
    return eval(code, {"Workload": Workload, "Config": Config, "RequestSpec": RequestSpec})


def test_hypothesis_prints_the_workload_as_its_rebuilding_code() -> None:
    """``pretty`` (what Hypothesis prints a failing argument with) of a Workload is its code."""
    workload = Workload(Config(kvcache_block_size=2, num_kvcache_blocks=8, max_model_len=16,
                               max_num_batched_tokens=16),
                        (RequestSpec(0, (1, 2), 2, True, (3, 3)),))
    text = pretty(workload)
    assert text == workload.code()
    assert "decode_gemm_prefetch" not in text
    assert _rebuilt(text) == workload


def test_the_code_keeps_config_fields_the_strategies_never_draw() -> None:
    """A user's workload with other fields changed (``async_scheduling``, ``seed``: any field
    off its default) rebuilds with them, not with the defaults."""
    config = Config(kvcache_block_size=2, num_kvcache_blocks=8, max_model_len=16,
                    max_num_batched_tokens=16, async_scheduling=False, seed=7)
    workload = Workload(config, (RequestSpec(0, (1, 2), 2, True, (3, 3)),))
    assert _rebuilt(workload.code()).config == config


def test_a_failing_policy_property_prints_one_short_block(policy_module, capsys) -> None:
    """The whole failure as Hypothesis reports it: the violations and the workload, with no
    line of the full Config dump."""
    module = policy_module("starving_short_only", STARVES)

    @settings(max_examples=30, database=None, derandomize=True, phases=[Phase.generate])
    @given(workloads(policies=(f"{module}:ShortOnly",)))
    def test(workload):
        run_workload(workload).raise_violations()

    with pytest.raises(PropertyViolations) as failure:
        test()
    notes = "\n".join(getattr(failure.value, "__notes__", []))
    assert "Failing test case" in notes or "Falsifying example" in notes
    assert "workload=Workload(Config(policy=" in notes
    assert "freeze_gc_heap" not in notes and "decode_gemm_prefetch" not in notes


FLIPS = """
    from engine.policy import Policy


    class FlipsPerInstance(Policy):
        '''Reverses the queue in every other engine: state kept across instances.'''

        built = 0

        def __init__(self, config):
            super().__init__(config)
            type(self).built += 1
            self.reverse = type(self).built % 2 == 1

        def admit(self, waiting, step):
            order = list(waiting)[::-1] if self.reverse else list(waiting)
            for seq in order:
                if seq.num_tokens > step.tokens_left:
                    return
                yield seq
"""


def test_the_replay_violation_names_the_policy(policy_module) -> None:
    """The ``replay`` property's line names the policy that decided otherwise (it said "the
    policy"), so a report of several properties or policies points at the one to fix."""
    module = policy_module("flips_per_instance", FLIPS)
    config = Config(policy=f"{module}:FlipsPerInstance", kvcache_block_size=2,
                    num_kvcache_blocks=8, max_model_len=16, max_num_batched_tokens=16, eos=-1)
    run = run_workload(Workload(config, (RequestSpec(0, (1, 2), 2, True, (3, 3)),
                                         RequestSpec(0, (4, 5, 6), 2, True, (3, 3)))))
    (line,) = run.violations["replay"]
    assert f"policy '{module}:FlipsPerInstance' decided otherwise" in line


SJF = """
    from engine.policy import Policy


    class ShortestJobFirst(Policy):
        def admit(self, waiting, step):
            for seq in sorted(waiting, key=lambda s: s.num_tokens):
                if seq.num_tokens > step.tokens_left:
                    return
                yield seq
"""


def test_verify_elsewhere_of_a_user_policy_trace_says_why_once(
        policy_module, tmp_path, monkeypatch, capsys) -> None:
    """A trace recorded with a user policy, verified where its module is not importable: the
    CLI and ``assert_replays`` say it once, with the PYTHONPATH hint (a note said the same
    line before the error); where it is importable the trace verifies identically."""
    import sys

    from engine import LLM, SamplingParams
    from replay.cli.main import main
    from replay.testing import assert_replays
    from replay.testing.replays import ReplayMismatch

    module = policy_module("sjf_elsewhere", SJF)
    trace = tmp_path / "trace"
    llm = LLM(None, trace_dir=str(trace), policy=f"{module}:ShortestJobFirst",
              calibration_repeats=0, kvcache_block_size=16, num_kvcache_blocks=8,
              max_model_len=64, max_num_batched_tokens=64)
    llm.generate([[1, 2, 3] * 5, [5, 6]], SamplingParams(max_tokens=2, ignore_eos=True),
                 use_tqdm=False)
    llm.close()
    assert assert_replays(trace).identical

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    sys.modules.pop(module, None)
    monkeypatch.chdir(tmp_path / "trace")
    capsys.readouterr()
    assert main(["verify", str(trace)]) == 2
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert text.count(f"cannot import {module}") == 1, text
    assert "PYTHONPATH" in text and "Traceback" not in text
    # The trace is sound; only its policy's code is absent here: not "the config is invalid".
    assert "config is invalid" not in text
    assert "recorded with the user policy" in text
    with pytest.raises(ReplayMismatch) as failure:
        assert_replays(trace)
    assert str(failure.value).count(f"cannot import {module}") == 1


def test_a_single_policy_without_the_tuple_comma_is_that_policy() -> None:
    """``workloads(policies=("chunked"))`` (a string: the tuple's comma forgotten) draws that
    policy; it sampled the string's characters and failed with "policy must be one of ... got
    'c'", and ``engine_configs`` and ``evictions=("lru")`` likewise."""
    from hypothesis import HealthCheck

    from replay.testing import engine_configs

    seen: set[str] = set()

    @settings(max_examples=10, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(workloads(policies=("chunked"), evictions=("lru")),
           engine_configs(policies="priority", evictions="lru"))
    def test(workload, config):
        seen.update((workload.config.policy, config.policy, workload.config.eviction,
                     config.eviction))

    test()
    assert seen == {"chunked", "priority", "lru"}
