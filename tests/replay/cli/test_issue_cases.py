"""Issue 13, data loss, silent wrong answers and start-up: each case as a test.

Commands run in-process (``replay.cli.main.main``) unless a kill -9 is needed. docs/TESTING.md
("Bad input and faults") lists every case with the outcome; test_issue_tracebacks.py has the
cases that used to end in a traceback.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli import (
    REPO,
    SAMPLE,
    TINY_REQUEST,
    corrupt_copy,
    one_error,
    owned_trace,
    run_cli,
    snapshot,
    write_jsonl,
)

from tracing.outdir import DirLock
from tracing.reader import read_trace


# --- data loss ------------------------------------------------------------------------------------
def test_run_never_deletes_a_directory_that_merely_holds_run_json(tmp_path: Path,
                                                                 tiny_workload: Path) -> None:
    """Case 1: `p/run.json` + `p/notes.txt` + `p/data/`: refused, every file stays."""
    p = tmp_path / "p"
    (p / "data").mkdir(parents=True)
    (p / "run.json").write_text("{}")
    (p / "notes.txt").write_text("x")
    before = snapshot(tmp_path)
    code, _, err = run_cli(["run", "--workload", str(tiny_workload), "--out", str(p), "--force"])
    assert code == 2
    one_error(err, "did not write")
    assert snapshot(tmp_path) == before


def test_run_never_replaces_the_working_directory(tmp_path: Path, tiny_workload: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Case 1: `--out .` from inside a trace replayllm wrote (even with --force): refused."""
    trace = owned_trace(tmp_path / "t")
    before = snapshot(tmp_path)
    monkeypatch.chdir(trace)
    code, _, err = run_cli(["run", "--workload", str(tiny_workload), "--out", ".", "--force"])
    assert code == 2
    one_error(err, "working directory")
    assert snapshot(tmp_path) == before


def test_a_bad_model_leaves_the_old_trace(tmp_path: Path, tiny_workload: Path) -> None:
    """Case 2: `run --model /nonexistent --out t --force` fails at the model: `t` is intact."""
    trace = owned_trace(tmp_path / "t")
    before = snapshot(tmp_path)
    code, _, err = run_cli(["run", "--model", str(tmp_path / "nonexistent"), "--workload",
                            str(tiny_workload), "--out", str(trace), "--force"])
    assert code == 2
    one_error(err)
    assert snapshot(tmp_path) == before


def test_a_bad_max_tokens_is_found_before_the_old_trace_goes(tmp_path: Path) -> None:
    """Case 2: a `max_tokens` of -5 fails before anything else: no empty "complete" trace."""
    trace = owned_trace(tmp_path / "t")
    workload = write_jsonl(tmp_path / "w.jsonl", [{**TINY_REQUEST, "max_tokens": -5}])
    before = snapshot(tmp_path)
    code, _, err = run_cli(["run", "--workload", str(workload), "--out", str(trace), "--force"])
    assert code == 2
    one_error(err, "max_tokens")
    assert snapshot(tmp_path) == before


def test_a_trace_being_recorded_is_never_replaced(tmp_path: Path, tiny_workload: Path) -> None:
    """Case 3: another process holds the trace's lock: a second run is refused at once."""
    trace = owned_trace(tmp_path / "t")
    (trace / "summary.json").unlink()  # still being recorded: no summary yet
    lock = DirLock(trace)
    try:
        before = snapshot(tmp_path)
        code, _, err = run_cli(["run", "--workload", str(tiny_workload), "--out", str(trace),
                                "--force"])
        assert code == 2
        one_error(err, "being recorded by another process", f"pid {os.getpid()}")
        assert snapshot(tmp_path) == before
    finally:
        lock.release()


def test_a_failed_replace_leaves_the_old_trace_whole(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Case 3: the old trace cannot be moved aside (read-only parent, immutable file): one line,
    and the old trace is still all there (it is renamed aside before anything is deleted)."""
    from tracing import outdir

    trace = owned_trace(tmp_path / "t")
    before = snapshot(tmp_path / "t")

    def refuse(src: object, dst: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(outdir.os, "replace", refuse)
    with pytest.raises(outdir.OutputDirError, match="cannot replace.*nothing was removed"):
        outdir.replace_dir(trace)
    assert snapshot(tmp_path / "t") == before
    assert [p.name for p in tmp_path.iterdir()] == ["t"]


def test_the_recorder_flushes_while_the_engine_is_idle(tmp_path: Path) -> None:
    """Case 4, in-process: events of a finished request reach disk on the time limit while the
    engine waits for a later arrival, with no further step."""
    from engine.config import Config
    from engine.engine_core import EngineCore
    from engine.executor import NullExecutor
    from engine.sampling_params import SamplingParams
    from tracing.recorder import ParquetRecorder

    config = Config(num_kvcache_blocks=8, kvcache_block_size=4, max_model_len=64,
                    max_num_batched_tokens=64)
    recorder = ParquetRecorder(tmp_path / "t", flush_steps=10_000, flush_seconds=0.05,
                               fsync=False)
    core = EngineCore(config, NullExecutor(8, vocab_size=1000), sink=recorder)
    core.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    core.run_until_idle()
    assert read_trace(tmp_path / "t").counts()["request_finished"] == 0  # not yet flushed
    time.sleep(0.06)
    core.on_idle()
    deadline = time.monotonic() + 5
    while read_trace(tmp_path / "t").counts()["request_finished"] == 0:
        assert time.monotonic() < deadline, "the idle flush never committed"
        time.sleep(0.01)
    core.close()


def test_kill_9_while_idle_keeps_the_finished_request(tmp_path: Path) -> None:
    """Case 4, a real process: requests at 0 s and 600 s, `trace_flush_seconds=0.2`, kill -9
    once the first has finished and the engine idles: the trace holds that request's finish.
    (Before the idle flush nothing reached disk until the second arrival's step.)"""
    workload = write_jsonl(tmp_path / "w.jsonl", [TINY_REQUEST, {**TINY_REQUEST,
                                                                 "arrival_s": 600.0}])
    trace = tmp_path / "t"
    proc = subprocess.Popen(
        [sys.executable, "-m", "replay.cli.main", "run", "--workload", str(workload), "--out",
         str(trace), "--set", "trace_flush_seconds=0.2"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        finished = 0
        while finished == 0:
            assert proc.poll() is None, "the run ended early"
            assert time.monotonic() < deadline, "the first request's finish never reached disk"
            time.sleep(0.2)
            try:
                finished = read_trace(trace).counts()["request_finished"]
            except Exception:  # not created yet
                finished = 0
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    got = read_trace(trace)
    assert not got.complete and got.counts()["request_finished"] == 1
    code, out, _ = run_cli(["verify", str(trace)])
    assert code == 0 and "incomplete" in out


# --- silent wrong answers -------------------------------------------------------------------------
def test_whatif_writes_a_clean_output_directory(tmp_path: Path) -> None:
    """A second whatif into the same --out leaves none of the first run's files."""
    out = tmp_path / "w"
    assert run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(out)])[0] == 0
    (out / "stale.png").write_bytes(b"old")  # as an earlier run with plots would leave
    code, _, err = run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(out)])
    assert code == 2
    one_error(err, "stale.png")  # a file whatif did not write: nothing is replaced
    (out / "stale.png").unlink()
    (tmp_path / "w2").mkdir()
    assert run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(out)])[0] == 0
    assert run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(out),
                    "--timing-from", str(SAMPLE)])[0] == 0
    names = sorted(p.name for p in out.iterdir())
    assert "stale.png" not in names and "summary.parquet" in names


def test_whatif_exits_2_when_no_variant_can_run(tmp_path: Path) -> None:
    """Every variant cannot run: the table still shows it, and the exit status is 2."""
    code, out, err = run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(tmp_path / "w"),
                              "--set", "num_kvcache_blocks=1"])
    assert code == 2
    one_error(err, "no variant could run")
    assert "cannot run" in out
    code, out, err = run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(tmp_path / "w"),
                              "--grid", "num_kvcache_blocks=1,28"])
    assert code == 0 and "cannot run" in out


def test_whatif_warns_on_an_incomplete_source(tmp_path: Path) -> None:
    trace = corrupt_copy(tmp_path, lambda t: (t / "summary.json").unlink())
    code, out, _ = run_cli(["whatif", str(trace), "--no-plots", "--out", str(tmp_path / "w")])
    assert code == 0
    assert "warning" in out and "incomplete" in out


def test_the_reject_reason_is_in_the_trace(tmp_path: Path) -> None:
    """A request with a token id outside the vocabulary: its reason is stored in
    request_finished.error, and the trace verifies (replay passes the recorded reason back)."""
    from engine import LLM, SamplingParams

    llm = LLM(None, trace_dir=str(tmp_path / "t"))
    outputs = llm.generate([[1, 2, 3], [1, 10**6]], SamplingParams(temperature=0.0, max_tokens=2),
                           use_tqdm=False)
    llm.close()
    assert outputs[1]["finish_reason"] == "rejected"
    finished = read_trace(tmp_path / "t").df("request_finished").set_index("seq_id")
    assert finished.loc[1, "error"] == outputs[1]["error"] and "vocabulary" in outputs[1]["error"]
    assert finished.loc[0, "error"] == ""
    code, out, _ = run_cli(["verify", str(tmp_path / "t")])
    assert code == 0, out


# --- start-up -------------------------------------------------------------------------------------
def test_cpu_start_up_skips_calibration_and_the_api_says_how_to_replace(tmp_path: Path) -> None:
    """On the CPU `LLM()` runs no start-up calibration by default; re-running the README example
    on the same trace_dir says `force=True`, which replaces it."""
    from engine import LLM
    from tracing.errors import TraceError

    llm = LLM(None, trace_dir=str(tmp_path / "t"))
    assert llm.config.calibration_repeats == 0 and "calibration" not in llm.core.header
    llm.generate([[1, 2]], use_tqdm=False)
    llm.close()
    with pytest.raises(TraceError, match=r"force=True"):
        LLM(None, trace_dir=str(tmp_path / "t"))
    llm = LLM(None, trace_dir=str(tmp_path / "t"), force=True)
    llm.close()
    assert read_trace(tmp_path / "t").complete
