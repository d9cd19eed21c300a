"""Reading damaged or unreachable trace files: one ``TraceError`` line naming the file, exit 2
from the CLI, never a traceback, and the trace left as it was.

Before these fixes: a string column holding bytes that are not UTF-8 (a bit flipped in a data
page, which Parquet's footer checks never see) raised ``UnicodeDecodeError`` out of ``inspect``,
``verify`` and ``export``; a trace directory or kind directory the user may not search, or a
path too long for the file system, raised ``PermissionError`` / ``OSError`` from the reader's
``Path.exists()`` probes; ``export --out`` with a name too long did the same; a
``summary.json`` that is a symbolic link looping on itself, or a ``_commits`` that is a file,
read as an incomplete trace ("recording stopped") instead of damage.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.replay.cli._cli import SAMPLE, run_cli
from tracing import TraceError, read_trace


def _copy(tmp_path: Path) -> Path:
    trace = tmp_path / "t"
    shutil.copytree(SAMPLE, trace)
    return trace


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _not_utf8(path: Path, column: str) -> None:
    """Rewrite ``path`` with the first value of string ``column`` starting with bytes that are
    not UTF-8 (what a flipped bit in its data page gives), every other byte kept."""
    table = pq.read_table(path)
    values = [v.encode() for v in table.column(column).to_pylist()]
    values[0] = b"\xff\xfe" + values[0][2:]
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    bad = pa.Array.from_buffers(pa.string(), len(values),
                                [None, pa.py_buffer(offsets.tobytes()),
                                 pa.py_buffer(b"".join(values))])
    index = table.column_names.index(column)
    pq.write_table(table.set_column(index, table.schema.field(column), bad), path)


@pytest.mark.parametrize("command", ["inspect", "verify", "export"])
def test_text_that_is_not_utf8_is_one_line(tmp_path: Path, command: str) -> None:
    trace = _copy(tmp_path)
    damaged = trace / "request_finished" / "seg-000000.parquet"
    _not_utf8(damaged, "reason")
    before = _digest(trace)
    code, _, err = run_cli([command, str(trace)])
    assert code == 2
    assert err.count("\n") == 1
    assert f"{damaged}: column reason holds text that is not UTF-8" in err
    assert _digest(trace) == before


def test_not_utf8_in_the_python_api(tmp_path: Path) -> None:
    trace = _copy(tmp_path)
    _not_utf8(trace / "model_step" / "seg-000001.parquet", "kind")
    opened = read_trace(trace)  # the footer is sound: found when the data is read
    for read in (opened.table, opened.columns):
        with pytest.raises(TraceError, match="column kind holds text that is not UTF-8"):
            read("model_step")


def _as_nobody(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``replayllm ARGV`` run as user nobody (root searches every directory)."""
    return subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                           sys.executable, "-m", "replay.cli.main", *argv],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2],
                          check=False)


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="takes root (to run as another user) and setpriv")


@needs_root
@pytest.mark.parametrize("locked", [".", "model_step"])
def test_a_directory_that_cannot_be_searched(locked: str) -> None:
    # Not under tmp_path: pytest's base directory is closed to other users.
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        os.chmod(top, 0o755)
        _unsearchable(_copy(Path(top)), locked)


def _unsearchable(trace: Path, locked: str) -> None:
    for path in (trace, *trace.rglob("*")):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    os.chmod(trace / locked, 0o700)
    done = _as_nobody(["inspect", str(trace)])
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1
    assert "Permission denied" in done.stderr
    assert str(trace / locked if locked != "." else trace) in done.stderr


@pytest.mark.parametrize("command", ["inspect", "verify", "export"])
def test_a_trace_path_too_long(tmp_path: Path, command: str) -> None:
    long = tmp_path / ("a" * 300)
    code, _, err = run_cli([command, str(long)])
    assert code == 2
    assert err.count("\n") == 1
    assert f"{long}: cannot read (File name too long)" in err


@pytest.mark.parametrize("fmt", ["perfetto", "vllm-kv-events"])
def test_an_export_name_too_long(tmp_path: Path, fmt: str) -> None:
    out = tmp_path / ("b" * 300)
    code, _, err = run_cli(["export", str(SAMPLE), "--format", fmt, "--out", str(out)])
    assert code == 2
    assert err.count("\n") == 1
    assert f"{out}: cannot be used (File name too long)" in err


def test_a_summary_link_looping_on_itself_is_damage(tmp_path: Path) -> None:
    trace = _copy(tmp_path)
    (trace / "summary.json").unlink()
    os.symlink(trace / "summary.json", trace / "summary.json")
    with pytest.raises(TraceError, match="summary.json: cannot read"):
        read_trace(trace)


def test_a_dangling_summary_link_is_damage(tmp_path: Path) -> None:
    trace = _copy(tmp_path)
    (trace / "summary.json").unlink()
    os.symlink(tmp_path / "gone.json", trace / "summary.json")
    with pytest.raises(TraceError, match="summary.json: a symbolic link to nothing"):
        read_trace(trace)


def test_commits_that_is_a_file_is_damage(tmp_path: Path) -> None:
    trace = _copy(tmp_path)
    (trace / "summary.json").unlink()
    shutil.rmtree(trace / "_commits")
    (trace / "_commits").write_text("x")
    with pytest.raises(TraceError, match="_commits: not a directory"):
        read_trace(trace)


def _repeat_an_event_id(path: Path) -> int:
    """Rewrite ``path`` with its second row's event id set to its first's (in range, same row
    count: the footer checks all pass); return the repeated id."""
    table = pq.read_table(path)
    ids = table.column("event_id").to_pylist()
    ids[1] = ids[0]
    pq.write_table(table.set_column(0, table.schema.field("event_id"),
                                    pa.array(ids, pa.int64())), path)
    return ids[0]


@pytest.mark.parametrize("command", ["inspect", "verify", "export"])
def test_an_event_id_twice_is_damage_not_a_divergence(tmp_path: Path, command: str) -> None:
    """Before: ``verify`` replayed it and reported a divergence of the scheduler (exit 1), and
    ``inspect`` and ``export`` counted the row twice."""
    trace = _copy(tmp_path)
    damaged = trace / "token_sampled" / "seg-000000.parquet"
    repeated = _repeat_an_event_id(damaged)
    code, out, err = run_cli([command, str(trace)])
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert f"{damaged}: event id {repeated} is in 2 rows" in err
    opened = read_trace(trace)
    for read in (opened.table, opened.columns):
        with pytest.raises(TraceError, match=f"event id {repeated} is in 2 rows"):
            read("token_sampled")


def _flip(path: Path, flip: dict[int, int]) -> None:
    data = bytearray(path.read_bytes())
    for offset, value in flip.items():
        data[offset] = value
    path.write_bytes(bytes(data))


# Bytes of footers of the sample's files as random bit flips left them (``flip``: offset ->
# value), each a different damage of the footer's metadata.
ROW_GROUPS_GONE = {773: 5, 774: 148, 775: 59, 776: 55}  # batch_scheduled/seg-000001
NAME_NOT_UTF8 = {1062: 198, 1063: 182, 1064: 180, 1065: 76}  # block_freed/seg-000000
TYPE_UNKNOWN = {685: 79}  # block_freed/seg-000001


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_footer_whose_row_groups_lost_its_rows(tmp_path: Path, command: str) -> None:
    """Before: ``ValueError: zero-size array to reduction operation minimum`` (a traceback)
    from the event-id check, which found the footer's row count right and read no row."""
    trace = _copy(tmp_path)
    damaged = trace / "batch_scheduled" / "seg-000001.parquet"
    _flip(damaged, ROW_GROUPS_GONE)
    meta = pq.ParquetFile(damaged).metadata
    assert (meta.num_rows, meta.num_row_groups) == (2, 0)  # the damage this test is about
    code, out, err = run_cli([command, str(trace)])
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert f"{damaged}: damaged footer: it says 2 rows, its row groups hold 0" in err


@pytest.mark.parametrize(("segment", "flip", "what"), [
    (0, NAME_NOT_UTF8, "a column name that is not UTF-8"),
    (1, TYPE_UNKNOWN, "column event_id of type UNKNOWN, the schema's INT64"),
])
def test_a_footer_whose_column_metadata_is_damaged(tmp_path: Path, segment: int,
                                                   flip: dict[int, int], what: str) -> None:
    """Before: the name was a ``UnicodeDecodeError`` traceback from the footer statistics'
    reader (``column_bounds``); the type killed the process (pyarrow's C++ ``terminate``,
    exit -6, no message naming the file) when the statistics were looked at."""
    trace = _copy(tmp_path)
    damaged = trace / "block_freed" / f"seg-00000{segment}.parquet"
    _flip(damaged, flip)
    done = subprocess.run([sys.executable, "-m", "replay.cli.main", "inspect", str(trace)],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2],
                          check=False)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (f"replayllm inspect: error: {damaged}: damaged footer: "
                           f"{what}\n")
