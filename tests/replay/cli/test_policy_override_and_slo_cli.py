"""Session 32 (what-if and tune): defects found in ``whatif`` and ``tune`` end to end.

What these tests prove: a trace recorded with a user policy whose module is absent runs under
``whatif --set policy=BUILTIN`` (or a grid of built-ins) and ``tune --space policy=...``, its
as-recorded run then a ``cannot run`` row naming the policy, while without such an override
both commands still refuse it with one line naming the policy; ``tune`` refuses an SLO metric
given twice with one line before any work.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli import SAMPLE, message_lines, run_cli, user_policy_copy

USER_POLICY = "nomodule32.sched:Missing"
REFERENCE = "traces/h200-reference-s4"  # max_model_len 4096 under prefill_first


@pytest.fixture
def user_policy_trace(tmp_path: Path) -> Path:
    """traces/cpu-tiny-demo as if recorded with a user policy that cannot be imported here."""
    return user_policy_copy(tmp_path / "user-policy", USER_POLICY)


def _one_line_naming_the_policy(code: int, err: str) -> None:
    (line,) = message_lines(err)
    assert code == 2 and f"user policy {USER_POLICY}" in line and "PYTHONPATH" in line


def test_whatif_overriding_a_missing_user_policy_runs_without_its_module(user_policy_trace,
                                                                         tmp_path):
    out = str(tmp_path / "w")
    code, text, err = run_cli(["whatif", str(user_policy_trace), "--set", "policy=chunked",
                               "--out", out, "--no-plots"])
    assert code == 0, err  # was exit 2: the recorded configuration's policy was imported first
    assert "\npolicy=chunked " in text
    code, text, err = run_cli(["whatif", str(user_policy_trace), "--grid",
                               "policy=chunked,prefill_first", "--out", out, "--no-plots",
                               "--jobs", "1"])
    assert code == 0, err
    assert "\npolicy=prefill_first " in text
    # Not every variant sets a policy: the recorded one is needed, and named.
    code, _, err = run_cli(["whatif", str(user_policy_trace), "--out", out, "--no-plots"])
    _one_line_naming_the_policy(code, err)
    code, _, err = run_cli(["whatif", str(user_policy_trace), "--grid", "max_num_seqs=2,4",
                            "--out", out, "--no-plots", "--jobs", "1"])
    _one_line_naming_the_policy(code, err)


def test_tune_over_built_in_policies_runs_without_a_missing_user_policy(user_policy_trace,
                                                                        tmp_path):
    out = str(tmp_path / "t")
    code, text, err = run_cli(["tune", str(user_policy_trace), "--slo", "ttft_p99=10",
                               "--space", "policy=chunked", "--out", out, "--no-plots",
                               "--jobs", "1"])
    assert code == 0, err
    assert f"as recorded: cannot run: policy '{USER_POLICY}'" in text
    assert "best: policy=chunked" in text and "\n--set policy=chunked\n" in text
    # The default space's policy values are the search's, not the user's: still refused.
    code, _, err = run_cli(["tune", str(user_policy_trace), "--slo", "ttft_p99=10",
                            "--out", out, "--no-plots", "--jobs", "1"])
    _one_line_naming_the_policy(code, err)


def test_tune_refuses_an_slo_metric_given_twice(tmp_path):
    code, text, err = run_cli(["tune", str(SAMPLE), "--slo", "ttft_p99=1", "--slo",
                               "ttft_p99=2", "--out", str(tmp_path / "t"), "--no-plots"])
    (line,) = message_lines(err)
    assert code == 2 and "--slo ttft_p99 is given twice" in line  # was: both limits kept
    assert text == ""  # before any work: no model fitted, nothing searched


@pytest.mark.parametrize("space, message", [
    (["max_num_seqs="], "--space expects KEY=V1,V2,... (no empty value)"),  # was: --grid
    (["max_num_seqs=64", "max_num_seqs=128"], "max_num_seqs is given twice (--space and --space)"),
    # was: "no configuration of the space is valid (see engine/config.py's rules)", no reason
    (["max_num_batched_tokens=512,1024"], "(2 rejected; the first, max_num_batched_tokens=512: "
                                          "max_num_batched_tokens (512) must be >= max_model_len"),
])
def test_tune_space_errors_name_the_space_and_why(space, message, tmp_path):
    args = [a for s in space for a in ("--space", s)]
    code, _, err = run_cli(["tune", REFERENCE, "--slo", "ttft_p99=1", *args,
                            "--out", str(tmp_path / "t"), "--no-plots"])
    (line,) = message_lines(err)
    assert code == 2 and message in line and "--grid" not in line
