"""``whatif`` and ``tune`` on traces at the edges, recorded with the tiny model on CPU: one
with no request (an ``LLM`` opened and closed), one whose every request was rejected."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli import SAMPLE, message_lines, run_cli, write_jsonl

from engine.llm import LLM
from engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def edge_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("edges")
    LLM(None, trace_dir=str(root / "empty"), kvcache_block_size=16).close()
    llm = LLM(None, trace_dir=str(root / "rejected"), kvcache_block_size=16, max_model_len=32,
              max_num_batched_tokens=64)
    for _ in range(3):  # each prompt longer than max_model_len: rejected as it is added
        llm.add_request(list(range(5, 65)), SamplingParams(max_tokens=4, temperature=0.0))
    while not llm.is_finished():
        llm.step()
    llm.close()
    for name in ("aborted", "plain"):  # one workload, every request aborted mid-way or none
        llm = LLM(None, trace_dir=str(root / name), kvcache_block_size=16)
        seqs = [llm.add_request(list(range(5, 30 + i)), SamplingParams(max_tokens=20,
                                                                       temperature=0.0))
                for i in range(4)]
        for _ in range(2):
            llm.step()
        for seq in seqs if name == "aborted" else []:
            llm.core.abort(seq.seq_id)
        while not llm.is_finished():
            llm.step()
        llm.close()
    return {name: root / name for name in ("empty", "rejected", "aborted", "plain")}


@pytest.mark.parametrize("command", ["whatif", "tune"])
def test_a_trace_without_requests_is_one_line(edge_traces: dict[str, Path], tmp_path: Path,
                                              command: str) -> None:
    """A trace holding no request printed a table of zeros and exit 0 (``tune``: "misses
    ttft_p99 nan ms", exit 1), where an empty ``--workload`` file is refused: now one line,
    exit 2, no output."""
    extra = ["--slo", "ttft_p99=5", "--jobs", "1"] if command == "tune" else []
    code, _, err = run_cli([command, str(edge_traces["empty"]), "--timing-from", str(SAMPLE),
                            "--out", str(tmp_path / "o"), "--no-plots", *extra])
    assert code == 2
    (line,) = message_lines(err)
    assert line.endswith(f"{edge_traces['empty']} recorded no request: nothing to re-run")
    assert not (tmp_path / "o").exists()


def test_tune_where_no_request_is_served_names_no_nan(edge_traces: dict[str, Path],
                                                      tmp_path: Path) -> None:
    """Every request rejected in every configuration: the closest run "missed ttft_p99 nan ms
    > 5000 ms"; it now says the metric has no value, with exit 1 (nothing meets)."""
    code, text, err = run_cli(["tune", str(edge_traces["rejected"]), "--timing-from",
                               str(SAMPLE), "--slo", "ttft_p99=5", "--jobs", "1",
                               "--out", str(tmp_path / "o"), "--no-plots"])
    assert code == 1, err
    (closest,) = [line for line in text.splitlines() if line.startswith("closest:")]
    assert closest.endswith("misses ttft_p99 has no value (no request served has one)")
    assert "nan" not in closest


def test_timing_from_a_trace_that_ran_no_step_says_so(edge_traces: dict[str, Path],
                                                      tmp_path: Path,
                                                      tiny_workload: Path) -> None:
    """``--timing-from`` a trace of no step said "recorded without a model" (it was recorded
    with one); it now says the trace ran no step."""
    code, _, err = run_cli(["whatif", "--workload", str(tiny_workload), "--timing-from",
                            str(edge_traces["empty"]), "--out", str(tmp_path / "o"),
                            "--no-plots"])
    assert code == 2
    (line,) = message_lines(err)
    assert line.endswith(f"{edge_traces['empty']} has no measured step times (it ran no step)")


@pytest.mark.parametrize("setting", ["num_kvcache_blocks=1", "max_model_len=2"])
def test_a_streamed_run_where_no_variant_can_run_exits_2(tmp_path: Path, setting: str) -> None:
    """``--stream`` with a pool or ``max_model_len`` too small for every request printed the
    ``cannot run`` row and exited 0; as without ``--stream`` it now exits 2 with the one line
    naming why, the outputs still written."""
    workload = write_jsonl(tmp_path / "long.jsonl", [  # more than one KV block of any size
        {"prompt_token_ids": list(range(5, 1005)), "max_tokens": 2, "temperature": 0.0}])
    for stream in ([], ["--stream"]):
        out = tmp_path / ("s" if stream else "w")
        code, text, err = run_cli(["whatif", "--workload", str(workload), "--timing-from",
                                   str(SAMPLE), "--set", setting, "--out", str(out),
                                   "--no-plots", *stream])
        assert code == 2, (stream, text)
        (line,) = message_lines(err)
        assert f"no variant could run ({setting}: cannot run: 1 of 1 requests can never be " \
               "scheduled" in line
        assert (out / "summary.parquet").is_file()


def test_a_trace_too_short_to_time_points_to_timing_from(edge_traces: dict[str, Path],
                                                         tmp_path: Path) -> None:
    """Every request aborted after two steps: too few steps to fit a step-time model. The line
    said only that; it now says how many and to give ``--timing-from``, which then runs."""
    trace = str(edge_traces["aborted"])
    code, _, err = run_cli(["whatif", trace, "--out", str(tmp_path / "a"), "--no-plots"])
    assert code == 2
    (line,) = message_lines(err)
    assert line.endswith("has too few steps to fit a model (2 timed); give --timing-from a "
                         "trace (or MODEL.json) of more")
    code, text, err = run_cli(["whatif", trace, "--timing-from", str(SAMPLE), "--out",
                               str(tmp_path / "b"), "--no-plots", "--set", "max_num_seqs=1"])
    assert code == 0, err
    assert any(line.startswith("max_num_seqs=1 ") for line in text.splitlines())


def test_compare_with_other_aborts_names_them(edge_traces: dict[str, Path],
                                              tmp_path: Path) -> None:
    """``whatif TRACE --compare OTHER`` where OTHER aborted requests TRACE ran to the end (one
    workload: the check of prompt lengths and max_tokens passes) said only "decisions differ
    from event N (step 2, ...)", as if the simulator were wrong; a note now says the
    prediction replays TRACE's aborts and how many differ. The same aborts: no note."""
    plain, aborted = str(edge_traces["plain"]), str(edge_traces["aborted"])
    code, text, err = run_cli(["whatif", plain, "--compare", aborted, "--out",
                               str(tmp_path / "a"), "--no-plots"])
    assert code == 0, err
    (note,) = [line for line in text.splitlines() if "aborted 4 requests" in line]
    assert note == (f"note: {aborted} aborted 4 requests, {plain} 0 (4 differ): the prediction "
                    f"replays {plain}'s aborts, so the decisions part where they differ")
    code, text, err = run_cli(["whatif", plain, "--compare", plain, "--out",
                               str(tmp_path / "b"), "--no-plots"])
    assert code == 0, err
    assert "the prediction replays" not in text
