"""Output files and directories of every command: one line before any work, never a lost file.

Each test names the command that overwrote a file, wrote into a trace or gave a traceback
before ``tracing.outfile.check_output_file`` / ``replay.cli.paths`` checked its path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli import SAMPLE, one_error, owned_trace, run_cli, snapshot

PRECIOUS = "a file of the user's own\n"


def _precious(tmp_path: Path) -> Path:
    path = tmp_path / "precious.txt"
    path.write_text(PRECIOUS)
    return path


def test_kv_export_never_overwrites_a_trace_header_or_a_user_file(tmp_path: Path) -> None:
    """`export --format vllm-kv-events --out TRACE/run.json` replaced the trace's header with
    msgpack (the trace was lost), `--out mine.txt` replaced the user's file and `--out DIR` was
    a traceback. Now: one line each, everything intact; the default output (inside the trace)
    is written, rewritten, and does not stop `run --force` from replacing the trace later."""
    trace = owned_trace(tmp_path / "t")
    mine = _precious(tmp_path)
    (tmp_path / "d").mkdir()
    before = snapshot(trace)
    for out, needle in ((trace / "run.json"), "kv-events.msgpack"), (mine, "--force"), (
            tmp_path / "d", "not a regular file"):
        code, _, err = run_cli(["export", str(trace), "--format", "vllm-kv-events",
                                "--out", str(out)])
        assert code == 2, err
        one_error(err, needle)
    assert snapshot(trace) == before and mine.read_text() == PRECIOUS
    for _ in range(2):
        code, _, err = run_cli(["export", str(trace), "--format", "vllm-kv-events"])
        assert code == 0, err
    assert (trace / "kv-events.msgpack").is_file()
    from tracing.layout import trace_entries

    assert "kv-events.msgpack" in trace_entries()


def test_export_never_writes_into_another_trace(tmp_path: Path) -> None:
    """`export A --out B/x.json` added a file to trace B (then one `run --force` refuses)."""
    other = owned_trace(tmp_path / "b")
    before = snapshot(other)
    code, _, err = run_cli(["export", str(SAMPLE), "--out", str(other / "x.json")])
    assert code == 2
    one_error(err, "inside")
    assert snapshot(other) == before


@pytest.mark.parametrize("command", ["whatif", "tune"])
def test_report_path_checked_before_any_work(tmp_path: Path, command: str) -> None:
    """`--report DIR` was a traceback after the whole run; `--report mine.txt` and
    `--report TRACE/x.html` overwrote or added a file. Now one line at once, nothing written."""
    trace = owned_trace(tmp_path / "t")
    mine = _precious(tmp_path)
    (tmp_path / "d").mkdir()
    extra = ["--slo", "ttft_p99=1"] if command == "tune" else []
    before = snapshot(trace)
    for report, needle in ((tmp_path / "d", "not a regular file"), (mine, "not an earlier"),
                           (trace / "x.html", "inside"), (tmp_path / "o" / "r.html", "--out")):
        code, out, err = run_cli([command, str(SAMPLE), "--no-plots", "--jobs", "1", *extra,
                                  "--out", str(tmp_path / "o"), "--report", str(report)])
        assert code == 2, err
        one_error(err, needle)
        assert out == ""  # refused before the fit and the search
    assert snapshot(trace) == before and mine.read_text() == PRECIOUS
    assert not (tmp_path / "o").exists()


def test_whatif_report_is_rewritten_whole(tmp_path: Path) -> None:
    """An earlier report is replaced (the page starts as replayllm writes it); no temporary
    file is left beside it."""
    report = tmp_path / "r.html"
    for _ in range(2):
        code, _, err = run_cli(["whatif", str(SAMPLE), "--no-plots", "--jobs", "1",
                                "--out", str(tmp_path / "o"), "--report", str(report)])
        assert code == 0, err
    assert report.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "r.html"]


def test_tune_out_is_checked_first_and_written_whole(tmp_path: Path) -> None:
    """`tune --out FILE` was a traceback after the whole search; `tune --out TRACE` wrote
    tune.parquet into the trace. Now both are one line before the search; a fresh --out is
    written whole and rewritten by the next tune."""
    trace = owned_trace(tmp_path / "t")
    mine = _precious(tmp_path)
    before = snapshot(trace)
    base = ["tune", str(SAMPLE), "--no-plots", "--jobs", "1", "--budget", "2",
            "--slo", "ttft_p99=1", "--space", "max_num_seqs=2,4"]
    for out, needle in ((mine, "not a directory"), (trace, "holds a replayllm trace")):
        code, stdout, err = run_cli([*base, "--out", str(out)])
        assert code == 2, err
        one_error(err, needle)
        assert stdout == ""
    assert snapshot(trace) == before and mine.read_text() == PRECIOUS
    for _ in range(2):
        code, _, err = run_cli([*base, "--out", str(tmp_path / "o")])
        assert code in (0, 1), err
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        ".replayllm-output.json", "tune.parquet"]


@pytest.mark.parametrize("sub", ["generate", "import"])
def test_workload_out_never_replaces_a_file_it_did_not_write(tmp_path: Path, sub: str,
                                                             tiny_workload: Path) -> None:
    """`workload generate/import --out TRACE/run.json` replaced a trace's header, `--out
    mine.txt` the user's file, and `--out DIR` was a traceback. Now one line each; an
    earlier workload file is still replaced."""
    trace = owned_trace(tmp_path / "t")
    mine = _precious(tmp_path)
    (tmp_path / "d").mkdir()
    before = snapshot(trace)
    argv = (["workload", "generate", "--num-requests", "2"] if sub == "generate"
            else ["workload", "import", str(tiny_workload), "--format", "replayllm"])
    for out, needle in ((trace / "run.json", "inside"), (mine, "not an earlier"),
                        (tmp_path / "d", "not a regular file")):
        code, _, err = run_cli([*argv, "--out", str(out)])
        assert code == 2, err
        one_error(err, needle)
    assert snapshot(trace) == before and mine.read_text() == PRECIOUS
    for _ in range(2):
        code, _, err = run_cli([*argv, "--out", str(tmp_path / "w2.jsonl")])
        assert code == 0, err


def test_describe_plots_path(tmp_path: Path, tiny_workload: Path) -> None:
    """`workload describe --plots mine.txt` was a matplotlib traceback (unknown format);
    `--plots mine.png` overwrote a PNG the user made. Now one line; a new plot is written."""
    mine = _precious(tmp_path)
    png = tmp_path / "photo.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nnot matplotlib's")
    for plots, needle in ((mine, ".png"), (png, "not an earlier plot")):
        code, _, err = run_cli(["workload", "describe", str(tiny_workload), "--plots",
                                str(plots)])
        assert code == 2, err
        one_error(err, needle)
    assert mine.read_text() == PRECIOUS and png.read_bytes().endswith(b"not matplotlib's")


def test_loadgen_out_checked_before_connecting(tmp_path: Path, tiny_workload: Path) -> None:
    """`loadgen --out DIR` or `--out mine.txt` failed (or overwrote) only after the whole load
    had run; now one line before any request is sent (the URL is never reached)."""
    mine = _precious(tmp_path)
    for out, needle in ((tmp_path, "not a regular file"), (mine, "not an earlier")):
        code, _, err = run_cli(["loadgen", str(tiny_workload), "--url", "http://127.0.0.1:9",
                                "--out", str(out)])
        assert code == 2, err
        one_error(err, needle)
    assert mine.read_text() == PRECIOUS


def test_no_output_directory_inside_a_trace(tmp_path: Path, tiny_workload: Path) -> None:
    """`run --out TRACE/sub`, `make-model --out TRACE/m`, `whatif --out TRACE/w` and `tune
    --out TRACE/t` each made a directory inside a trace (which `run --force` then refused to
    replace: "holds 'sub', which replayllm did not write"). Now one line, the trace as it was."""
    trace = owned_trace(tmp_path / "t")
    before = snapshot(trace)
    for argv in (["run", "--workload", str(tiny_workload), "--out", str(trace / "sub")],
                 ["make-model", "--out", str(trace / "m")],
                 ["whatif", str(SAMPLE), "--no-plots", "--out", str(trace / "w")],
                 ["tune", str(SAMPLE), "--slo", "ttft_p99=1", "--out", str(trace / "x" / "t")]):
        code, _, err = run_cli(argv)
        assert code == 2, err
        one_error(err, "is inside")
    assert snapshot(trace) == before


@pytest.mark.parametrize("name", ["", "d", "precious.txt", "t/p.json"])
def test_profile_out_checked_before_timing(tmp_path: Path, name: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`profile --out DIR` (or "", once the working directory) was a traceback after the whole
    profile had run (minutes on a GPU), `--out mine.txt` overwrote the user's file and
    `--out TRACE/p.json` wrote into a trace. Now one line before the model loads; an empty
    `--out` names the option."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    mine = _precious(tmp_path)
    owned_trace(tmp_path / "t")
    code, out, err = run_cli(["profile", "--out", name, "--budget-s", "1"])
    assert code == 2, err
    one_error(err, name or "--out is empty")
    assert out == "" and mine.read_text() == PRECIOUS


def test_profile_rewrites_its_own_file(tmp_path: Path) -> None:
    """A profile is written whole (no temporary left) and replaces an earlier profile."""
    out = tmp_path / "p.json"
    for _ in range(2):
        code, _, err = run_cli(["profile", "--out", str(out), "--budget-s", "0.5", "--quiet"])
        assert code == 0, err
    assert out.read_text().startswith('{\n "format": "replayllm-profile"')
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


@pytest.mark.parametrize("argv", [
    ["whatif", str(SAMPLE), "--no-plots", "--jobs", "1", "--out", "{f}/o"],
    ["tune", str(SAMPLE), "--slo", "ttft_p99=1", "--no-plots", "--jobs", "1", "--out", "{f}/o"],
    ["whatif", str(SAMPLE), "--no-plots", "--jobs", "1", "--out", "{d}/o", "--report",
     "{f}/r.html"],
    ["profile", "--out", "{f}/p.json"],
    ["loadgen", "{w}", "--url", "http://127.0.0.1:9", "--out", "{f}/r.parquet"],
    ["workload", "describe", "{w}", "--plots", "{f}/w.png"],
    ["workload", "generate", "--num-requests", "2", "--out", "{f}/w.jsonl"],
])
def test_an_output_under_a_file_is_refused_before_any_work(tmp_path: Path, tiny_workload: Path,
                                                           argv: list[str]) -> None:
    """`--out notes.txt/o`: whatif and tune ran the whole search, printed it, then failed to
    write it; profile timed the model for minutes first; loadgen would have lost the run;
    `describe --plots notes.txt/w.png` was a FileExistsError traceback. Now one line naming
    the file in the way, before anything runs, and the file is untouched."""
    notes = _precious(tmp_path)
    args = [a.format(f=notes, d=tmp_path, w=tiny_workload) for a in argv]
    code, out, err = run_cli(args)
    assert code == 2, err
    one_error(err, "precious.txt is a file, not a directory")
    assert "variant" not in out and notes.read_text() == PRECIOUS
