"""A buggy user policy through every entry point: ``replay.testing`` reports it as a violation
with the shrunk workload, the recording so far stays closed and readable, and the CLI (``run``,
``verify``, ``whatif``) prints one line and exits non-zero, with no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings

from engine.policy import PolicyError
from replay.testing import PropertyViolations, check_trace, run_workload, workloads
from replay.testing.replays import ReplayMismatch
from replay.testing.strategies import scaled

RAISES = """
    from engine.policy import Policy


    class Raises(Policy):
        '''Admits twice, then raises in admit.'''

        def __init__(self, config):
            super().__init__(config)
            self.calls = 0

        def admit(self, waiting, step):
            self.calls += 1
            if self.calls > 2:
                raise KeyError("oops")
            yield from super().admit(waiting, step)


    class BadInit(Policy):
        def __init__(self, config):
            raise ValueError("no")
"""


@pytest.fixture
def raises_module(policy_module) -> str:
    return policy_module("raising_policy", RAISES)


def test_a_raising_policy_is_a_policy_violation_with_the_shrunk_workload(raises_module) -> None:
    """Hypothesis gets a PropertyViolations report (the ``policy`` property, the exception in
    one line, the workload as code to paste), not the policy's KeyError."""

    @settings(max_examples=scaled(0.2), database=None)
    @given(workloads(policies=(f"{raises_module}:Raises",)))
    def test(workload):
        run_workload(workload).raise_violations()

    with pytest.raises(PropertyViolations) as failure:
        test()
    report = str(failure.value)
    assert "policy: step 2: policy 'raising_policy:Raises' raised KeyError: 'oops'" in report
    assert "rebuild it: Workload(" in report


def test_a_policy_that_cannot_be_built_is_a_policy_violation(raises_module) -> None:
    """A policy whose __init__ raises: run_workload returns the ``policy`` violation naming it
    (nothing ran), instead of raising ValueError."""
    from engine.config import Config
    from replay.testing import RequestSpec, Workload

    config = Config(policy=f"{raises_module}:BadInit", kvcache_block_size=2,
                    num_kvcache_blocks=8, max_model_len=16, max_num_batched_tokens=16)
    run = run_workload(Workload(config, (RequestSpec(0, (1, 2), 2, True, (3, 3)),)))
    assert list(run.violations) == ["policy"]
    assert "BadInit(config) raised ValueError: no" in run.violations["policy"][0]


def test_the_cli_reports_a_policy_error_in_one_line_and_keeps_the_trace(
    raises_module, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``replayllm run`` under a policy that raises mid-run exits 2 with one line naming the
    policy; the trace it leaves is closed, readable and incomplete (the step the error cut is
    dropped: the run did not finish; it was a complete trace whose requests never finished);
    ``verify`` and ``whatif`` exit 2 with one line (in a ``whatif`` grid the policy's variant
    alone cannot run, the others are predicted); ``assert_replays`` (the pytest plugin's check)
    fails with ReplayMismatch saying why it cannot replay."""
    from replay.cli.main import main
    from replay.testing import assert_replays
    from tracing.reader import read_trace

    monkeypatch.chdir(Path(__file__).resolve().parents[3])
    out = tmp_path / "trace"
    policy = f"policy={raises_module}:Raises"
    code = main(["run", "--num-seqs", "6", "--out", str(out), "--set", policy,
                 "--set", "max_num_seqs=2"])
    err = capsys.readouterr().err
    assert code == 2
    line = "policy 'raising_policy:Raises' raised KeyError: 'oops' (raising_policy.py:15) in admit"
    assert f"replayllm run: error: {line}" in err and "Traceback" not in err
    trace = read_trace(out)
    assert trace.header["policy"] == f"{raises_module}:Raises"
    assert not trace.complete and not (out / "summary.json").exists()
    report = check_trace(out)
    assert report.names() == [], report.report()

    assert main(["verify", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"replayllm verify: error: {line}" in err and "Traceback" not in err
    with pytest.raises(ReplayMismatch, match="cannot replay: policy 'raising_policy:Raises'"):
        assert_replays(out)

    assert main(["whatif", "traces/cpu-tiny-demo", "--set", policy, "--out",
                 str(tmp_path / "w0"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replayllm whatif: error: no variant could run") and line in err
    assert err.count("\n") == 1 and "Traceback" not in err
    # In a grid, the failing policy fails its own variant only: the others are predicted.
    grid = f"policy=prefill_first,{raises_module}:Raises"
    assert main(["whatif", "traces/cpu-tiny-demo", "--grid", grid, "--out",
                 str(tmp_path / "w"), "--no-plots"]) == 0
    out_text = capsys.readouterr().out
    assert "cannot run: policy 'raising_policy:Raises' raised KeyError" in out_text


def test_a_policy_error_is_a_project_error() -> None:
    """PolicyError is one of the project's errors (the CLI's one-line path catches them)."""
    from engine.errors import ReplayLLMError

    assert issubclass(PolicyError, ReplayLLMError)
