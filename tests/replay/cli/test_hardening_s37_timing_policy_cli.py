"""``--timing-from`` a trace recorded with a user policy whose module is gone.

Step times are fitted on a trace's measured steps: its scheduling policy plays no part, and a
plain ``whatif TRACE`` never uses the timing trace's configuration. Before: ``whatif TRACE
--timing-from USER_POLICY_TRACE`` (and ``--stream``, ``tune --workload ... --space
policy=...``) failed with exit 2, "the trace was recorded with the user policy ..., which
cannot be loaded here", although no variant ran that policy. With ``--workload``, where the
timing trace's configuration is every variant's base, a variant keeping its policy is still
refused in one line naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli import SAMPLE, message_lines, run_cli, user_policy_copy

USER_POLICY = "nomodule37.sched:Gone"


@pytest.fixture
def gone_policy_trace(tmp_path: Path) -> Path:
    """traces/cpu-tiny-demo as if recorded with a user policy that cannot be imported here."""
    return user_policy_copy(tmp_path / "user policy ü", USER_POLICY)


@pytest.fixture
def workload_file(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"prompt_token_ids": list(range(1, 9 + i)),
                                        "max_tokens": 3}) + "\n" for i in range(4)))
    return path


def test_a_trace_source_takes_step_times_from_a_user_policy_trace(gone_policy_trace, tmp_path):
    code, text, err = run_cli(["whatif", str(SAMPLE), "--timing-from", str(gone_policy_trace),
                               "--set", "max_num_seqs=2", "--out", str(tmp_path / "w"),
                               "--no-plots"])
    assert code == 0, err
    assert "\nmax_num_seqs=2 " in text


def test_a_workload_whose_variants_set_a_policy_needs_no_recorded_one(gone_policy_trace,
                                                                       workload_file, tmp_path):
    for extra in (["--set", "policy=chunked"], ["--set", "policy=chunked", "--stream"],
                  ["--grid", "policy=chunked,prefill_first", "--jobs", "1"]):
        code, text, err = run_cli(["whatif", "--workload", str(workload_file), "--timing-from",
                                   str(gone_policy_trace), "--out", str(tmp_path / "w"),
                                   "--no-plots", *extra])
        assert code == 0, (extra, err)
        assert "\npolicy=chunked " in text
    code, text, err = run_cli(["tune", "--workload", str(workload_file), "--timing-from",
                               str(gone_policy_trace), "--slo", "ttft_p99=100", "--space",
                               "policy=chunked,prefill_first", "--out", str(tmp_path / "t"),
                               "--no-plots", "--jobs", "1"])
    assert code == 0, err
    assert f"as recorded: cannot run: policy '{USER_POLICY}'" in text


@pytest.mark.parametrize("extra", [[], ["--stream"], ["--set", "max_num_seqs=2"]])
def test_a_workload_variant_keeping_the_recorded_policy_is_refused_in_one_line(
        gone_policy_trace, workload_file, tmp_path, extra):
    code, _, err = run_cli(["whatif", "--workload", str(workload_file), "--timing-from",
                            str(gone_policy_trace), "--out", str(tmp_path / "w"), "--no-plots",
                            *extra])
    (line,) = message_lines(err)
    assert code == 2 and f"user policy {USER_POLICY}" in line and "PYTHONPATH" in line
