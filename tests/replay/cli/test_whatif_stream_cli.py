"""``replayllm whatif --workload FILE --stream [--trace-out DIR]`` end to end.

What these tests prove: the streamed run prints the same table and writes the same summary as
the whole-workload run of the same file; ``--trace-out`` writes a trace of the simulated run;
misuse (a trace source, a grid with --trace-out) is one clear line and exit status 2; a
progress bar per variant on a terminal's stderr only, the outputs unchanged by it.
"""

from __future__ import annotations

import contextlib

import pandas as pd

from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request
from replay.workloads.store import WorkloadWriter
from tests.replay.cli.test_whatif_cli import run_cli, traces  # noqa: F401 (fixture)


def workload_file(path) -> str:
    writer = WorkloadWriter(path)
    for i, r in enumerate(reference_workload(num_seqs=12)):
        writer.write(Request(r.prompt[:200], min(r.max_tokens, 60), arrival_s=0.05 * i))
    writer.close()
    return str(path)


def test_streamed_run_matches_the_whole_workload_run(traces, tmp_path, capsys):  # noqa: F811
    path = workload_file(tmp_path / "w.parquet")
    common = ["--workload", path, "--timing-from", traces["a"], "--no-plots",
              "--set", "num_kvcache_blocks=40"]
    code, whole, _ = run_cli(capsys, *common, "--out", str(tmp_path / "whole"))
    assert code == 0
    code, streamed, _ = run_cli(capsys, *common, "--out", str(tmp_path / "streamed"), "--stream",
                                "--trace-out", str(tmp_path / "trace"))
    assert code == 0
    def table(text: str) -> list[str]:
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("variant "))
        return lines[start:start + 2]

    assert table(streamed) == table(whole)
    streamed_summary = pd.read_parquet(tmp_path / "streamed" / "summary.parquet")
    whole_summary = pd.read_parquet(tmp_path / "whole" / "summary.parquet")
    # The notes differ by one: a streamed run says it skipped the timing coverage check.
    assert "is not checked" in streamed_summary.pop("notes")[0]
    whole_summary.pop("notes")
    pd.testing.assert_frame_equal(streamed_summary, whole_summary)
    assert (tmp_path / "trace" / "model_step").is_dir()


def test_stream_misuse_is_one_clear_line(traces, tmp_path, capsys):  # noqa: F811
    path = workload_file(tmp_path / "w.parquet")
    code, _, stderr = run_cli(capsys, traces["a"], "--stream", "--no-plots")
    assert code == 2 and "--workload FILE" in stderr and stderr.count("\n") == 1
    code, _, stderr = run_cli(capsys, "--workload", path, "--timing-from", traces["a"],
                              "--trace-out", str(tmp_path / "t"), "--grid", "max_num_seqs=2,4",
                              "--no-plots")
    assert code == 2 and "drop --grid" in stderr


def test_streamed_workloads_follow_the_plain_whatif_rules(traces, tmp_path, capsys):  # noqa: F811
    """An empty file streamed wrote results of no request and exited 0, and an arrival of
    1e300 s printed a 300-digit makespan: without --stream both are one line (no requests;
    an arrival past a week), and now with it too, before any table."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    far = tmp_path / "far.jsonl"
    far.write_text('{"prompt_token_ids": [1, 2], "max_tokens": 2}\n'
                   '{"prompt_token_ids": [1, 2], "max_tokens": 2, "arrival_s": 1e300}\n')
    for path, needle in ((empty, "the workload holds no requests"),
                         (far, "request 1: arrival_s must be a finite number of seconds")):
        for stream in ([], ["--stream"]):
            code, out, err = run_cli(capsys, "--workload", str(path), "--timing-from",
                                     traces["a"], "--no-plots", "--out",
                                     str(tmp_path / "o"), *stream)
            assert code == 2 and needle in err and err.count("\n") == 1, (stream, err)
            assert "variant" not in out and not (tmp_path / "o").exists()


def test_stream_says_it_draws_no_plots_in_output_and_report(traces, tmp_path,  # noqa: F811
                                                            capsys):
    """Before: ``--stream`` without ``--no-plots`` wrote no PNG and a ``--report`` page without
    a plot, saying nothing (a plain whatif draws four)."""
    path = workload_file(tmp_path / "w.parquet")
    page = tmp_path / "r.html"
    code, out, _ = run_cli(capsys, "--workload", path, "--timing-from", traces["a"], "--stream",
                           "--set", "num_kvcache_blocks=40", "--out", str(tmp_path / "o"),
                           "--report", str(page))
    assert code == 0
    assert "note: --stream draws no plots" in out
    assert not list((tmp_path / "o").glob("*.png"))
    assert "--stream draws no plots" in page.read_text()
    code, out, _ = run_cli(capsys, "--workload", path, "--timing-from", traces["a"], "--stream",
                           "--set", "num_kvcache_blocks=40", "--out", str(tmp_path / "o2"),
                           "--no-plots")
    assert code == 0 and "draws no plots" not in out


def test_stream_progress_bar_on_a_terminal_only_and_results_unchanged(traces, tmp_path,  # noqa: F811
                                                                       capsys, monkeypatch):
    """``whatif --stream`` was silent for the whole simulation (minutes for a million
    requests): it now draws one tqdm bar per variant on stderr, counting the requests finished
    of the file's, when stderr is a terminal (forced here); none when it is not (captured, as
    here unforced); the outputs are the same bytes either way."""
    from replay.cli import whatif_stream
    from replay.whatif import stream

    path = workload_file(tmp_path / "w.jsonl")  # JSONL with its header line: 12 requests
    argv = ["--workload", path, "--timing-from", traces["a"], "--no-plots", "--stream",
            "--set", "num_kvcache_blocks=40", "--grid", "max_num_seqs=2,4"]
    code, out_off, err_off = run_cli(capsys, *argv, "--out", str(tmp_path / "off"))
    assert code == 0 and err_off == ""
    monkeypatch.setattr(whatif_stream, "progress_wanted", lambda: True)
    code, out_on, err_on = run_cli(capsys, *argv, "--out", str(tmp_path / "on"))
    assert code == 0
    for name in ("max_num_seqs=2", "max_num_seqs=4"):
        assert f"{name}: 100%" in err_on and "12/12" in err_on, err_on
    assert out_on.replace(str(tmp_path / "on"), "OUT") == \
        out_off.replace(str(tmp_path / "off"), "OUT")
    written = sorted(p.name for p in (tmp_path / "off").iterdir())
    assert "summary.parquet" in written and "requests.parquet" in written
    for name in written:
        assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes()

    # The bar is told every PROGRESS_EVERY finished requests and at the end, never each step.
    calls: list[tuple[str, int | None, list[int]]] = []

    @contextlib.contextmanager
    def recording(name, total):
        calls.append((name, total, []))
        yield calls[-1][2].append

    monkeypatch.setattr(stream, "PROGRESS_EVERY", 5)
    monkeypatch.setattr(whatif_stream, "progress_bar", recording)
    assert run_cli(capsys, *argv, "--out", str(tmp_path / "rec"))[0] == 0
    assert [(name, total) for name, total, _ in calls] == [("max_num_seqs=2", 12),
                                                          ("max_num_seqs=4", 12)]
    for _, _, seen in calls:
        assert seen[-1] == 12 and len(seen) <= 4 and seen == sorted(seen), seen
        assert all(b - a >= 5 for a, b in zip(seen, seen[1:-1])), seen
