"""``replayllm whatif`` end to end (in-process, through ``replay.cli.main.main``).

What these tests prove: a variant, a grid (with a variant that cannot run shown as such in its
row), ``--compare`` (predicted vs measured with relative errors, decision streams identical),
``--workload bench --timing-from``, Parquet and PNG outputs; and bad input gets one clear line
and exit status 2: an unknown key lists the valid keys, a bad value names the field and range,
a trace without timings says it cannot predict times.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _cli import killed_copy

from engine.config import Config
from replay.cli.main import main as replayllm
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request
from tracing.reader import read_trace

CONFIG_A = Config(num_kvcache_blocks=60, kvcache_block_size=32, max_num_seqs=16)
CONFIG_B = Config(num_kvcache_blocks=30, kvcache_block_size=32, max_num_seqs=8)
NUM_SEQS = 16
PROMPT_TOKENS = 300
OUTPUT_TOKENS = 120
REPO = Path(__file__).resolve().parents[3]


def short_workload():
    """The reference workload's first requests, shortened so each trace takes ~100 steps."""
    return [Request(r.prompt[:PROMPT_TOKENS], min(r.max_tokens, OUTPUT_TOKENS))
            for r in reference_workload(num_seqs=NUM_SEQS)]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("whatif")
    requests = short_workload()
    out = {}
    for name, config, law in (("a", CONFIG_A, StepLaw()), ("b", CONFIG_B, StepLaw()),
                              ("cpu", CONFIG_A, None)):
        out[name] = str(root / name)
        record_workload(config, requests, law, trace_dir=out[name], seed=len(out))
    return out


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = replayllm(["whatif", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_one_variant_prints_a_table_and_writes_parquet_and_plots(traces, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, _ = run_cli(capsys, traces["a"], "--set", "max_num_seqs=4", "--out", str(out))
    assert code == 0
    assert "held-out MAPE" in stdout  # the step-time model reports its error
    assert "recorded" in stdout and "max_num_seqs=4" in stdout
    summary = pd.read_parquet(out / "summary.parquet")
    assert summary["variant"].tolist() == ["recorded", "max_num_seqs=4"]
    assert (summary["status"] == "ok").all() and summary["makespan_s"].notna().all()
    assert set(pd.read_parquet(out / "steps.parquet")["variant"]) == set(summary["variant"])
    assert (out / "cost_model.json").exists()
    pytest.importorskip("matplotlib")
    for name in ("kv_blocks.png", "batch_size.png", "latency_cdf.png", "variants.png"):
        assert (out / name).stat().st_size > 0, name


def test_grid_reports_a_variant_that_cannot_run_in_its_row(traces, tmp_path, capsys):
    out = tmp_path / "grid"
    code, stdout, stderr = run_cli(capsys, traces["a"], "--grid", "num_kvcache_blocks=4,30,60",
                                   "--grid", "max_num_seqs=4,16", "--out", str(out), "--no-plots")
    assert code == 0
    assert "\r" not in stderr and "whatif:" not in stderr  # no progress bar on a captured stderr
    rows = [line for line in stdout.splitlines() if line.startswith("num_kvcache_blocks=")]
    assert len(rows) == 6
    cannot = [line for line in rows if "cannot run:" in line]
    assert len(cannot) == 2 and all("num_kvcache_blocks=4 " in line for line in cannot)
    assert "whole pool has 4" in cannot[0]
    summary = pd.read_parquet(out / "summary.parquet")
    assert summary["status"].str.startswith("cannot run").sum() == 2


def test_compare_prints_predicted_against_measured(traces, tmp_path, capsys):
    code, stdout, _ = run_cli(capsys, traces["a"], "--compare", traces["b"],
                              "--out", str(tmp_path / "cmp"), "--no-plots")
    assert code == 0
    assert "max_num_seqs=8" in stdout and "num_kvcache_blocks=30" in stdout
    assert "decision streams: identical" in stdout
    table = pd.read_parquet(tmp_path / "cmp" / "compare.parquet").set_index("metric")
    assert abs(table.loc["makespan_s", "rel_error"]) < 0.03
    assert table.loc["preemptions", "rel_error"] == 0


def test_workload_without_a_trace_borrows_a_timing_model(traces, tmp_path, capsys):
    code, stdout, _ = run_cli(capsys, "--workload", "bench", "--num-seqs", "4",
                              "--timing-from", traces["a"], "--out", str(tmp_path / "w"),
                              "--no-plots")
    assert code == 0 and "as recorded" in stdout
    summary = pd.read_parquet(tmp_path / "w" / "summary.parquet")
    assert summary["makespan_s"].notna().all()


def test_untimed_trace_says_it_cannot_predict_times(traces, tmp_path, capsys):
    code, stdout, _ = run_cli(capsys, traces["cpu"], "--set", "max_num_seqs=4",
                              "--out", str(tmp_path / "u"), "--no-plots")
    assert code == 0
    assert "no measured step times" in stdout and "--timing-from" in stdout
    assert "n/a" in stdout
    code, stdout, _ = run_cli(capsys, traces["cpu"], "--timing-from", traces["a"],
                              "--out", str(tmp_path / "u2"), "--no-plots")
    assert code == 0 and "n/a" not in stdout.split("variant", 1)[1].splitlines()[2]


@pytest.mark.parametrize(
    "argv, expected",
    [
        # `model` is not listed: `--set model=` is refused (the checkpoint is `--model`).
        (["--set", "max_num_seq=4"], "valid keys: max_num_batched_tokens, max_num_seqs"),
        (["--set", "max_num_seqs=0"], "max_num_seqs must be int in [1, 2147483647], got 0"),
        (["--set", "max_num_seqs=many"], "max_num_seqs must be int"),
        (["--set", "policy=fastest"], "policy must be one of 'prefill_first', 'chunked'"),
        (["--grid", "num_kvcache_blocks="], "--grid expects KEY=V1,V2"),
        (["--grid", "gpu_memory_utilization=0.5,2"], "gpu_memory_utilization must be float in"),
        (["--set", "max_num_seqs"], "--set expects KEY=VALUE"),
        (["--host-from", "traces/cpu-tiny-demo"], "no host times or eager start-up calibration"),
    ],
)
def test_bad_input_is_one_clear_line(traces, capsys, argv, expected):
    code, stdout, stderr = run_cli(capsys, traces["a"], *argv, "--no-plots")
    assert code == 2
    assert stderr.count("\n") == 1 and expected in stderr
    assert "Traceback" not in stderr


def test_missing_trace_and_missing_pool_size_are_clear(capsys, tmp_path):
    code, _, stderr = run_cli(capsys, str(tmp_path / "nope"), "--no-plots")
    assert code == 2 and "no such trace directory" in stderr
    code, _, stderr = run_cli(capsys, "--workload", "bench", "--no-plots")
    assert code == 2 and "num_kvcache_blocks" in stderr
    code, _, stderr = run_cli(capsys, "--no-plots")
    assert code == 2 and "give a TRACE or --workload" in stderr


def test_a_table_of_only_variants_that_cannot_run_still_prints() -> None:
    from replay.whatif.report import variants_table

    text = variants_table([{"label": "num_kvcache_blocks=1", "status": "cannot run: too small",
                            "metrics": {}}])
    assert text.splitlines()[1] == "num_kvcache_blocks=1  cannot run: too small"


def test_fidelity_table_predicts_each_trace_from_the_other(traces) -> None:
    """The function behind the H200 fidelity test and docs table, on two law-timed traces."""
    from replay.whatif.fidelity import FIDELITY_TARGETS, fidelity, fidelity_markdown

    rows = fidelity([traces["a"], traces["b"]])
    assert [(r["source"], r["target"]) for r in rows] == [(traces["a"], traces["b"]),
                                                          (traces["b"], traces["a"])]
    for r in rows:
        assert r["decisions_identical"]
        assert all(abs(r[m]) <= limit for m, limit in FIDELITY_TARGETS.items()), r
    assert fidelity_markdown(rows).count("identical") == 2


def test_host_from_prices_host_work_on_another_machine(tmp_path, capsys):
    """``--host-from TRACE``: the note says whose calibration priced the host, and a run
    recorded on a slower host is predicted slower than from the source's host."""
    argv = ("traces/matrix-call9/reference-constrained", "--timing-from",
            "traces/h200-reference-s4", "--no-plots")
    code, plain, _ = run_cli(capsys, *argv, "--out", str(tmp_path / "p"))
    assert code == 0
    code, host, _ = run_cli(capsys, *argv, "--host-from",
                            "traces/matrix-call9/reference-constrained",
                            "--out", str(tmp_path / "h"))
    assert code == 0
    assert "start-up calibration (median over" in host and "calibration (median" not in plain
    # A saved model (the plain run's) priced on the host from the command line: the same.
    code, _, _ = run_cli(capsys, argv[0], "--timing-from", str(tmp_path / "p" / "cost_model.json"),
                         "--host-from", "traces/matrix-call9/reference-constrained",
                         "--no-plots", "--out", str(tmp_path / "s"))
    assert code == 0
    ttft = [pd.read_parquet(tmp_path / d / "summary.parquet").set_index("source").loc[
        "predicted", "ttft_mean_s"] for d in ("p", "h", "s")]
    assert ttft[1] > ttft[0] and ttft[2] == pytest.approx(ttft[1], rel=1e-9)


def test_compare_with_an_incomplete_recording_compares_its_finished_requests(
        traces, tmp_path, capsys):
    """--compare against a killed run's trace used to set the prediction of the whole workload
    beside the figures of the recorded prefix, silently (makespan "+258%", steps 915 vs 256,
    decisions "differ" at the end of the prefix). Now it says the recording is incomplete and
    how many requests it finished, and compares those requests only, each run up to the step
    that finished the last of them: the same steps, a close makespan, identical decisions."""
    from replay.recorded import from_trace
    from tracing.reader import read_trace

    killed = killed_copy(traces["b"], tmp_path / "killed", keep=1)
    recorded = from_trace(read_trace(killed))
    finished = len(recorded.tables["request_finished"]["seq_id"])
    assert not recorded.complete and 0 < finished < NUM_SEQS
    code, stdout, _ = run_cli(capsys, traces["a"], "--compare", killed,
                              "--out", str(tmp_path / "cmp"), "--no-plots")
    assert code == 0
    assert (f"warning: {killed} is incomplete (the recording stopped; committed through step "
            f"{recorded.last_step}): it finished {finished} of the {NUM_SEQS} requests; "
            f"comparing only those {finished}") in stdout
    assert f"decision streams (steps 0 to {recorded.last_step}): identical" in stdout
    table = pd.read_parquet(tmp_path / "cmp" / "compare.parquet").set_index("metric")
    assert table.loc["steps", "rel_error"] == 0 and table.loc["preemptions", "rel_error"] == 0
    assert abs(table.loc["makespan_s", "rel_error"]) < 0.03
    assert abs(table.loc["e2e_mean_s", "rel_error"]) < 0.03
    summary = pd.read_parquet(tmp_path / "cmp" / "summary.parquet")
    assert summary["requests"].tolist() == [finished, finished]
    assert summary["notes"].str.contains(f"{finished} of {NUM_SEQS} requests").all()


def test_compare_with_a_recording_that_finished_nothing_refuses(traces, tmp_path, capsys):
    """A killed recording that finished no request leaves nothing to compare: one line saying
    so, exit 2 (one that committed no step was said to have "ran another workload (0 vs 16
    requests)")."""
    killed = killed_copy(traces["b"], tmp_path / "killed", keep=0)
    code, _, stderr = run_cli(capsys, traces["a"], "--compare", killed,
                              "--out", str(tmp_path / "cmp"), "--no-plots")
    assert code == 2 and stderr.count("\n") == 1
    assert stderr.strip().endswith(f"finished none of the {NUM_SEQS} requests: nothing to compare")


def test_nothing_to_compare_is_refused_before_fitting_a_model(traces, tmp_path, capsys,
                                                              monkeypatch):
    """The refusal came only after the step-time model was fitted and printed."""
    from replay.whatif.cost.model import CostModel

    def no_fit(*args, **kwargs):
        raise AssertionError("a step-time model was fitted before the refusal")

    monkeypatch.setattr(CostModel, "fit", no_fit)
    killed = killed_copy(traces["b"], tmp_path / "killed", keep=0)
    code, stdout, stderr = run_cli(capsys, traces["a"], "--compare", killed,
                                   "--out", str(tmp_path / "cmp"), "--no-plots")
    assert code == 2 and "nothing to compare" in stderr and "MAPE" not in stdout


def test_whatif_on_an_incomplete_source_covers_the_requests_it_finished(traces, tmp_path,
                                                                         capsys):
    """Plain whatif on a killed trace set the figures of its recorded prefix (some requests
    unfinished) beside predictions running every request to the end, silently. Now it warns how
    many requests the recording finished of how many, and the recorded row and each predicted
    row (grid variants run in worker processes too) cover those requests only, each run cut at
    the step that finished the last of them: under the recorded config, the same steps."""
    from replay.recorded import from_trace
    from tracing.reader import read_trace

    killed = killed_copy(traces["b"], tmp_path / "killed", keep=1)
    recorded = from_trace(read_trace(killed))
    finished = len(set(recorded.tables["request_finished"]["seq_id"].tolist()))
    assert 0 < finished < NUM_SEQS
    code, stdout, _ = run_cli(capsys, killed, "--grid", "max_num_seqs=8,16", "--jobs", "2",
                              "--out", str(tmp_path / "w"), "--no-plots")
    assert code == 0
    assert (f"warning: {killed} is incomplete (the recording stopped; committed through step "
            f"{recorded.last_step}): it finished {finished} of the {NUM_SEQS} requests it "
            f"recorded; the recorded row and every prediction cover only those {finished}"
            ) in stdout
    summary = pd.read_parquet(tmp_path / "w" / "summary.parquet").set_index("variant")
    assert summary["requests"].tolist() == [finished] * 3
    same = summary.loc["max_num_seqs=8"]  # CONFIG_B's own max_num_seqs: the recorded config
    assert same["steps"] == summary.loc["recorded", "steps"]
    assert abs(same["makespan_s"] / summary.loc["recorded", "makespan_s"] - 1) < 0.03
    assert summary["notes"].str.contains(f"{finished} of {NUM_SEQS} requests").all()


def test_an_incomplete_source_that_finished_nothing_has_no_recorded_row(traces):
    """Nothing finished: no recorded row (its figures would be of no request) and the
    predictions run the whole workload, the warning saying so."""
    from replay.recorded import RecordedEvents, from_trace, keep_rows
    from replay.whatif.compare import incomplete_source, recorded_events
    from replay.whatif.simulate import load_source

    full = from_trace(read_trace(traces["b"]))
    finished = full.tables["request_finished"]
    none = keep_rows(finished, np.zeros(len(finished["seq_id"]), dtype=bool))
    cut = RecordedEvents(full.header, {**full.tables, "request_finished": none}, 100, False)
    workload = load_source(cut)
    warning = incomplete_source(workload, restrict=True)
    assert warning is not None and f"finished none of the {NUM_SEQS} requests" in warning
    assert workload.scope is None and recorded_events(workload) is None


def test_compare_from_an_incomplete_source_names_it(traces):
    """SOURCE killed before all of OTHER's requests arrived, OTHER complete: the refusal said
    "ran another workload (16 vs 8 requests ...)"; it now names the incomplete source."""
    from engine.errors import ReplayLLMError
    from replay.recorded import RecordedEvents, from_trace, keep_rows
    from replay.whatif.compare import check_same_workload
    from replay.whatif.simulate import load_source

    full = from_trace(read_trace(traces["a"]))
    added = full.tables["request_added"]
    first = keep_rows(added, np.arange(len(added["seq_id"])) < NUM_SEQS // 2)
    source = load_source(RecordedEvents(full.header, {**full.tables, "request_added": first},
                                        full.last_step, False))
    source.name = "a"
    other = from_trace(read_trace(traces["b"]))
    with pytest.raises(ReplayLLMError, match=(
            rf"^a is incomplete \(the recording stopped; committed through step \d+\): it "
            rf"recorded only {NUM_SEQS // 2} of the {NUM_SEQS} requests b ran; --compare needs "
            r"a source holding them all \(a complete recording\)$")):
        check_same_workload(source, other, "b")


def test_an_incomplete_recording_may_hold_only_the_first_requests(traces):
    """A recording killed before every request arrived holds a prefix of the workload: that is
    the same workload when incomplete, another one when complete."""
    from engine.errors import ReplayLLMError
    from replay.recorded import RecordedEvents, from_trace, keep_rows
    from replay.whatif.compare import check_same_workload
    from replay.whatif.simulate import load_source
    from tracing.reader import read_trace

    workload = load_source(traces["a"])
    other = from_trace(read_trace(traces["b"]))
    added = other.tables["request_added"]
    first = keep_rows(added, np.arange(len(added["seq_id"])) < NUM_SEQS // 2)
    for complete in (False, True):
        cut = RecordedEvents(other.header, {**other.tables, "request_added": first},
                             other.last_step, complete)
        if complete:
            with pytest.raises(ReplayLLMError, match=f"{NUM_SEQS // 2} vs {NUM_SEQS} requests"):
                check_same_workload(workload, cut, "b")
        else:
            check_same_workload(workload, cut, "b")


def test_whatif_without_compare_loads_no_http_client(tmp_path: Path) -> None:
    """A plain whatif never imports the load generator's HTTP client (aiohttp: ~0.3 s of the
    command's ~1.3 s) or the server's stack; only --compare LOADGEN_RESULT needs the reader."""
    import subprocess
    import sys

    trace = REPO / "traces" / "cpu-tiny-demo"
    code = (f"import sys; from replay.cli.main import main; "
            f"assert main(['whatif', {str(trace)!r}, '--set', 'num_kvcache_blocks=20', "
            f"'--no-plots', '--out', {str(tmp_path / 'out')!r}]) == 0; "
            f"bad = sorted({{m.split('.')[0] for m in sys.modules}} & "
            f"{{'aiohttp', 'fastapi', 'uvicorn', 'openai'}}); assert not bad, bad; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True,
                            capture_output=True, timeout=300, check=False)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr


def test_tune_on_an_incomplete_source_covers_the_requests_it_finished(traces, tmp_path, capsys):
    """``tune`` loads its TRACE as whatif does (``_source``): a killed source is warned about and
    searched over the requests it finished (this session's change first left tune calling the
    loader without its source: every tune run failed)."""
    killed = killed_copy(traces["b"], tmp_path / "killed", keep=1)
    code = replayllm(["tune", killed, "--slo", "ttft_p99=100", "--space", "max_num_seqs=8,16",
                      "--out", str(tmp_path / "t")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"warning: {killed} is incomplete" in out
    assert (tmp_path / "t" / "tune.parquet").exists()
