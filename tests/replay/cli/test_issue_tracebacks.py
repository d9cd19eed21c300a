"""Issue 13, tracebacks instead of one line: each case as a test (exit 2, one line on stderr).

Commands run in-process (``replay.cli.main.main``) unless a real pipe is needed.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
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
)


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
        one_error(err, "w.jsonl")
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
        one_error(err, field)


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
    # The bounds a frontend already found (LLM's vocabulary check) stand for a scan of their own.
    with pytest.raises(InvalidRequestError, match="token id"):
        check_recordable([1, 2**40], SamplingParams(max_tokens=1), bounds=(1, 2**40))
    check_recordable([1, 2], SamplingParams(max_tokens=1), bounds=(1, 2))


@pytest.mark.parametrize("setting,needle", [
    ("model=/x", "--model"), ("trace_flush_seconds=nan", "finite"),
    ("trace_flush_seconds=inf", "finite"), ("max_num_seqs=99999999999999999999", "max_num_seqs"),
])
def test_bad_set_values(tmp_path: Path, tiny_workload: Path, setting: str, needle: str) -> None:
    """`--set model=/x`, `--set trace_flush_seconds=nan`: one line, before any model loads."""
    code, _, err = run_cli(["run", "--workload", str(tiny_workload), "--out",
                            str(tmp_path / "o"), "--set", setting])
    assert code == 2
    one_error(err, needle)
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
        one_error(err, "not a directory")
    assert blocker.read_text() == "mine"


def test_out_that_is_a_symlink_to_a_trace(tmp_path: Path, tiny_workload: Path) -> None:
    """`--out LINK` where LINK points at a trace: refused; neither the link nor the trace moves."""
    trace = owned_trace(tmp_path / "t")
    (tmp_path / "link").symlink_to(trace)
    before = snapshot(tmp_path)
    code, _, err = run_cli(["run", "--workload", str(tiny_workload), "--out",
                            str(tmp_path / "link"), "--force"])
    assert code == 2
    one_error(err, "symbolic link")
    assert snapshot(tmp_path) == before


def test_make_model_seed_out_of_range(tmp_path: Path) -> None:
    code, _, err = run_cli(["make-model", "--seed", "99999999999999999999999",
                            "--out", str(tmp_path / "m")])
    assert code == 2
    one_error(err, "seed")
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


@pytest.mark.parametrize("value", [None, "12", -1, True, 1.5])
def test_commit_marker_num_events_not_an_integer(tmp_path: Path, value: object) -> None:
    """A commit marker with `num_events: null` (or a string, a bool, a wrong count)."""
    def edit(trace: Path) -> None:
        marker = trace / "_commits" / "seg-000000.json"
        data = json.loads(marker.read_text())
        data["num_events"] = value
        marker.write_text(json.dumps(data))

    trace = corrupt_copy(tmp_path, edit)
    for command in ("inspect", "verify"):
        code, _, err = run_cli([command, str(trace)])
        assert code == 2
        one_error(err, "seg-000000.json", "num_events")


def test_commit_marker_naming_a_file_outside_the_trace(tmp_path: Path) -> None:
    def edit(trace: Path) -> None:
        marker = trace / "_commits" / "seg-000000.json"
        data = json.loads(marker.read_text())
        data["files"]["model_step"]["file"] = "../../outside.parquet"
        marker.write_text(json.dumps(data))

    trace = corrupt_copy(tmp_path, edit)
    code, _, err = run_cli(["inspect", str(trace)])
    assert code == 2
    one_error(err, "expected 'model_step/seg-000000.parquet'")


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

    trace = corrupt_copy(tmp_path, edit)
    for argv in (["inspect", str(trace)], ["verify", str(trace)],
                 ["whatif", str(trace), "--no-plots", "--out", str(tmp_path / "w")]):
        code, _, err = run_cli(argv)
        assert code == 2
        one_error(err, "calibration")


def test_a_header_pool_too_large_to_replay(tmp_path: Path) -> None:
    """`num_blocks: 2^31 - 1` in run.json would make a replay build two billion blocks."""
    def edit(trace: Path) -> None:
        header = json.loads((trace / "run.json").read_text())
        header["config"]["num_kvcache_blocks"] = 2**31 - 1
        (trace / "run.json").write_text(json.dumps(header))

    trace = corrupt_copy(tmp_path, edit)
    code, _, err = run_cli(["verify", str(trace)])
    assert code == 2
    one_error(err, "num_kvcache_blocks")


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
    one_error(err, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_full_disk_during_whatif(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while whatif writes its tables: one line, nothing left at --out or beside it."""
    import pandas as pd

    def full(self: object, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    code, _, err = run_cli(["whatif", str(SAMPLE), "--no-plots", "--out", str(tmp_path / "w")])
    assert code == 2
    one_error(err, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_full_disk_during_make_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while writing the weights: one line, no checkpoint directory left."""
    from engine.model import checkpoint

    def full(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error while serializing: IoError(No space left on device)")

    monkeypatch.setattr(checkpoint, "save_file", full)
    code, _, err = run_cli(["make-model", "--out", str(tmp_path / "m")])
    assert code == 2
    one_error(err, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_make_model_replaces_only_its_own_checkpoint(tmp_path: Path) -> None:
    """make-model writes whole or not at all; a second one needs --force; a user's directory is
    never replaced."""
    out = tmp_path / "m"
    assert run_cli(["make-model", "--out", str(out)])[0] == 0
    code, _, err = run_cli(["make-model", "--out", str(out)])
    assert code == 2
    one_error(err, "--force")
    (out / "notes.txt").write_text("mine")
    code, _, err = run_cli(["make-model", "--out", str(out), "--force"])
    assert code == 2
    one_error(err, "notes.txt")
    (out / "notes.txt").unlink()
    assert run_cli(["make-model", "--out", str(out), "--force", "--seed", "1"])[0] == 0
    assert json.loads((out / "replayllm.json").read_text())["seed"] == 1


def test_export_refuses_to_overwrite_a_file_that_is_not_an_export(tmp_path: Path) -> None:
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "data"}')
    code, _, err = run_cli(["export", str(SAMPLE), "--out", str(mine)])
    assert code == 2
    one_error(err, "--force")
    assert mine.read_text() == '{"my": "data"}'
    assert run_cli(["export", str(SAMPLE), "--out", str(tmp_path / "e.json")])[0] == 0
    assert run_cli(["export", str(SAMPLE), "--out", str(tmp_path / "e.json")])[0] == 0


