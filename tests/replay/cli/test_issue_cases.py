"""Each case of issue 13 (data loss, tracebacks, silent wrong answers, slow start) as a test.

Commands run in-process (``replay.cli.main.main``) unless a real pipe or a kill -9 is needed.
Each test names the case; docs/TESTING.md ("Bad input and faults") lists them with the outcome.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli import REPO, SAMPLE, message_lines, owned_trace, run_cli, snapshot, write_jsonl

from tracing.outdir import DirLock
from tracing.reader import read_trace

TINY_REQUEST = {"prompt_token_ids": [1, 2, 3], "max_tokens": 2, "temperature": 0.0}


def _one_error(err: str, *needles: str) -> str:
    lines = message_lines(err)
    assert len(lines) == 1, lines
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def tiny_workload(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "w.jsonl", [TINY_REQUEST])


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
    _one_error(err, "did not write")
    assert snapshot(tmp_path) == before


def test_run_never_replaces_the_working_directory(tmp_path: Path, tiny_workload: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Case 1: `--out .` from inside a trace replayllm wrote (even with --force): refused."""
    trace = owned_trace(tmp_path / "t")
    before = snapshot(tmp_path)
    monkeypatch.chdir(trace)
    code, _, err = run_cli(["run", "--workload", str(tiny_workload), "--out", ".", "--force"])
    assert code == 2
    _one_error(err, "working directory")
    assert snapshot(tmp_path) == before


def test_a_bad_model_leaves_the_old_trace(tmp_path: Path, tiny_workload: Path) -> None:
    """Case 2: `run --model /nonexistent --out t --force` fails at the model: `t` is intact."""
    trace = owned_trace(tmp_path / "t")
    before = snapshot(tmp_path)
    code, _, err = run_cli(["run", "--model", str(tmp_path / "nonexistent"), "--workload",
                            str(tiny_workload), "--out", str(trace), "--force"])
    assert code == 2
    _one_error(err)
    assert snapshot(tmp_path) == before


def test_a_bad_max_tokens_is_found_before_the_old_trace_goes(tmp_path: Path) -> None:
    """Case 2: a `max_tokens` of -5 fails before anything else: no empty "complete" trace."""
    trace = owned_trace(tmp_path / "t")
    workload = write_jsonl(tmp_path / "w.jsonl", [{**TINY_REQUEST, "max_tokens": -5}])
    before = snapshot(tmp_path)
    code, _, err = run_cli(["run", "--workload", str(workload), "--out", str(trace), "--force"])
    assert code == 2
    _one_error(err, "max_tokens")
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
        _one_error(err, "being recorded by another process", f"pid {os.getpid()}")
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


# --- tracebacks instead of one line ---------------------------------------------------------------
@pytest.mark.parametrize("content", [b"[1, 2]\n", b"\xff\xfe not utf-8\n", b"42\n"])
def test_workload_lines_that_are_not_objects(tmp_path: Path, content: bytes) -> None:
    """A JSONL line that is not an object, or a file that is not UTF-8: one line, exit 2."""
    workload = tmp_path / "w.jsonl"
    workload.write_bytes(content)
    for argv in (["run", "--workload", str(workload), "--out", str(tmp_path / "o")],
                 ["whatif", "--workload", str(workload), "--no-plots", "--set",
                  "num_kvcache_blocks=100", "--out", str(tmp_path / "w")]):
        code, _, err = run_cli(argv)
        assert code == 2, err
        _one_error(err, "w.jsonl")
    assert not (tmp_path / "o").exists() and not (tmp_path / "w").exists()


@pytest.mark.parametrize("field,value", [
    ("arrival_s", float("nan")), ("arrival_s", float("inf")), ("arrival_s", 1e12),
    ("max_tokens", 10**12), ("prompt_token_ids", [1, 2**40]),
])
def test_out_of_range_request_fields(tmp_path: Path, field: str, value: object) -> None:
    """NaN, infinite or 1e12 arrivals, max_tokens 10^12, token id 2^40: `run` and `whatif`
    refuse them in one line (no endless wait, no int32 overflow that loses the trace)."""
    row = {**TINY_REQUEST, field: value}
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps(row) + "\n")  # json writes NaN / Infinity literals
    for argv in (["run", "--workload", str(workload), "--out", str(tmp_path / "o")],
                 ["whatif", "--workload", str(workload), "--no-plots", "--set",
                  "num_kvcache_blocks=100", "--out", str(tmp_path / "w")]):
        code, _, err = run_cli(argv)
        assert code == 2, err
        _one_error(err, field)


def test_the_engine_refuses_values_no_trace_column_holds() -> None:
    """Request intake: a token id or max_tokens past int32 raises before anything is recorded."""
    from engine.engine_core import check_recordable
    from engine.errors import InvalidRequestError
    from engine.sampling_params import SamplingParams

    with pytest.raises(InvalidRequestError, match="token id"):
        check_recordable([1, 2**40], SamplingParams(max_tokens=1))
    with pytest.raises(InvalidRequestError, match="token id"):
        check_recordable([-(2**31) - 1], SamplingParams(max_tokens=1))
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        check_recordable([1], SamplingParams(max_tokens=2**31))
    check_recordable([-(2**31), 2**31 - 1], SamplingParams(max_tokens=2**31 - 1))


@pytest.mark.parametrize("setting,needle", [
    ("model=/x", "--model"), ("trace_flush_seconds=nan", "finite"),
    ("trace_flush_seconds=inf", "finite"), ("max_num_seqs=99999999999999999999", "max_num_seqs"),
])
def test_bad_set_values(tmp_path: Path, tiny_workload: Path, setting: str, needle: str) -> None:
    """`--set model=/x`, `--set trace_flush_seconds=nan`: one line, before any model loads."""
    code, _, err = run_cli(["run", "--workload", str(tiny_workload), "--out",
                            str(tmp_path / "o"), "--set", setting])
    assert code == 2
    _one_error(err, needle)
    assert not (tmp_path / "o").exists()


def test_config_rejects_non_finite_floats() -> None:
    from engine.config import Config
    from engine.errors import ConfigError

    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ConfigError, match="finite"):
            Config(trace_flush_seconds=bad)
        with pytest.raises(ConfigError, match="finite"):
            Config(gpu_memory_utilization=bad)


def test_out_that_is_a_file(tmp_path: Path) -> None:
    """`--out` that is a file (whatif, make-model, run): one line; the file is untouched."""
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    for argv in (["whatif", str(SAMPLE), "--no-plots", "--out", str(blocker)],
                 ["make-model", "--out", str(blocker)],
                 ["run", "--workload", "bench", "--out", str(blocker)]):
        code, _, err = run_cli(argv)
        assert code == 2
        _one_error(err, "not a directory")
    assert blocker.read_text() == "mine"


def test_out_that_is_a_symlink_to_a_trace(tmp_path: Path, tiny_workload: Path) -> None:
    """`--out LINK` where LINK points at a trace: refused; neither the link nor the trace moves."""
    trace = owned_trace(tmp_path / "t")
    (tmp_path / "link").symlink_to(trace)
    before = snapshot(tmp_path)
    code, _, err = run_cli(["run", "--workload", str(tiny_workload), "--out",
                            str(tmp_path / "link"), "--force"])
    assert code == 2
    _one_error(err, "symbolic link")
    assert snapshot(tmp_path) == before


def test_make_model_seed_out_of_range(tmp_path: Path) -> None:
    code, _, err = run_cli(["make-model", "--seed", "99999999999999999999999",
                            "--out", str(tmp_path / "m")])
    assert code == 2
    _one_error(err, "seed")
    assert not (tmp_path / "m").exists()


def test_inspect_into_a_closed_pipe() -> None:
    """`inspect TRACE | head -1`: exit 0, nothing on stderr (a true pipe, in a subprocess)."""
    done = subprocess.run(
        f"{sys.executable} -m replay.cli.main inspect {SAMPLE} | head -c 1; "
        "echo \" ${PIPESTATUS[0]}\"",
        shell=True, executable="/bin/bash", cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )
    assert done.stderr == ""
    assert done.stdout.split()[-1] == "0"


def _corrupt_copy(tmp_path: Path, edit: object) -> Path:
    trace = tmp_path / "t"
    shutil.copytree(SAMPLE, trace)
    edit(trace)  # type: ignore[operator]
    return trace


@pytest.mark.parametrize("value", [None, "12", -1, True, 1.5])
def test_commit_marker_num_events_not_an_integer(tmp_path: Path, value: object) -> None:
    """A commit marker with `num_events: null` (or a string, a bool, a wrong count)."""
    def edit(trace: Path) -> None:
        marker = trace / "_commits" / "seg-000000.json"
        data = json.loads(marker.read_text())
        data["num_events"] = value
        marker.write_text(json.dumps(data))

    trace = _corrupt_copy(tmp_path, edit)
    for command in ("inspect", "verify"):
        code, _, err = run_cli([command, str(trace)])
        assert code == 2
        _one_error(err, "seg-000000.json", "num_events")


def test_commit_marker_naming_a_file_outside_the_trace(tmp_path: Path) -> None:
    def edit(trace: Path) -> None:
        marker = trace / "_commits" / "seg-000000.json"
        data = json.loads(marker.read_text())
        data["files"]["model_step"]["file"] = "../../outside.parquet"
        marker.write_text(json.dumps(data))

    trace = _corrupt_copy(tmp_path, edit)
    code, _, err = run_cli(["inspect", str(trace)])
    assert code == 2
    _one_error(err, "expected 'model_step/seg-000000.parquet'")


@pytest.mark.parametrize("rows", [
    "not a list", [1, 2], [{"kind": "prefill"}], [{"kind": "decode", "graph_used": "yes"}],
    [{"kind": "prefill", "graph_used": False, "num_seqs": 1, "prefill_tokens": 1,
      "prefill_attn_work": 1, "decode_seqs": 0, "decode_context_tokens": 0,
      "padded_batch_size": 1, "interval_s": "NaN"}],
])
def test_malformed_calibration_rows(tmp_path: Path, rows: object) -> None:
    """Malformed `calibration` rows in run.json: `inspect`, `verify`, `whatif`: one line."""
    def edit(trace: Path) -> None:
        header = json.loads((trace / "run.json").read_text())
        header["calibration"] = rows
        (trace / "run.json").write_text(json.dumps(header))

    trace = _corrupt_copy(tmp_path, edit)
    for argv in (["inspect", str(trace)], ["verify", str(trace)],
                 ["whatif", str(trace), "--no-plots", "--out", str(tmp_path / "w")]):
        code, _, err = run_cli(argv)
        assert code == 2
        _one_error(err, "calibration")


def test_a_header_pool_too_large_to_replay(tmp_path: Path) -> None:
    """`num_blocks: 2^31 - 1` in run.json would make a replay build two billion blocks."""
    def edit(trace: Path) -> None:
        header = json.loads((trace / "run.json").read_text())
        header["config"]["num_kvcache_blocks"] = 2**31 - 1
        (trace / "run.json").write_text(json.dumps(header))

    trace = _corrupt_copy(tmp_path, edit)
    code, _, err = run_cli(["verify", str(trace)])
    assert code == 2
    _one_error(err, "num_kvcache_blocks")


def _no_space(monkeypatch: pytest.MonkeyPatch, module: object) -> None:
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if len(data) > 64:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(module.os, "write", full)  # type: ignore[attr-defined]


def test_full_disk_during_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while exporting: one line, no 0-byte or partial file under the name."""
    from tracing import outdir

    _no_space(monkeypatch, outdir)
    out = tmp_path / "e.json"
    code, _, err = run_cli(["export", str(SAMPLE), "--out", str(out)])
    assert code == 2
    _one_error(err, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_full_disk_during_whatif(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while whatif writes its tables: one line, nothing left at --out or beside it."""
    import pandas as pd

    def full(self: object, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    code, _, err = run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(tmp_path / "w")])
    assert code == 2
    _one_error(err, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_full_disk_during_make_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while writing the weights: one line, no checkpoint directory left."""
    from engine.model import checkpoint

    def full(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error while serializing: IoError(No space left on device)")

    monkeypatch.setattr(checkpoint, "save_file", full)
    code, _, err = run_cli(["make-model", "--out", str(tmp_path / "m")])
    assert code == 2
    _one_error(err, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_make_model_replaces_only_its_own_checkpoint(tmp_path: Path) -> None:
    """make-model writes whole or not at all; a second one needs --force; a user's directory is
    never replaced."""
    out = tmp_path / "m"
    assert run_cli(["make-model", "--out", str(out)])[0] == 0
    code, _, err = run_cli(["make-model", "--out", str(out)])
    assert code == 2
    _one_error(err, "--force")
    (out / "notes.txt").write_text("mine")
    code, _, err = run_cli(["make-model", "--out", str(out), "--force"])
    assert code == 2
    _one_error(err, "notes.txt")
    (out / "notes.txt").unlink()
    assert run_cli(["make-model", "--out", str(out), "--force", "--seed", "1"])[0] == 0
    assert json.loads((out / "replayllm.json").read_text())["seed"] == 1


def test_export_refuses_to_overwrite_a_file_that_is_not_an_export(tmp_path: Path) -> None:
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "data"}')
    code, _, err = run_cli(["export", str(SAMPLE), "--out", str(mine)])
    assert code == 2
    _one_error(err, "--force")
    assert mine.read_text() == '{"my": "data"}'
    assert run_cli(["export", str(SAMPLE), "--out", str(tmp_path / "e.json")])[0] == 0
    assert run_cli(["export", str(SAMPLE), "--out", str(tmp_path / "e.json")])[0] == 0


# --- silent wrong answers -------------------------------------------------------------------------
def test_whatif_writes_a_clean_output_directory(tmp_path: Path) -> None:
    """A second whatif into the same --out leaves none of the first run's files."""
    out = tmp_path / "w"
    assert run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(out)])[0] == 0
    (out / "stale.png").write_bytes(b"old")  # as an earlier run with plots would leave
    code, _, err = run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(out)])
    assert code == 2
    _one_error(err, "stale.png")  # a file whatif did not write: nothing is replaced
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
    _one_error(err, "no variant could run")
    assert "cannot run" in out
    code, out, err = run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(tmp_path / "w"),
                              "--grid", "num_kvcache_blocks=1,28"])
    assert code == 0 and "cannot run" in out


def test_whatif_warns_on_an_incomplete_source(tmp_path: Path) -> None:
    trace = _corrupt_copy(tmp_path, lambda t: (t / "summary.json").unlink())
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
