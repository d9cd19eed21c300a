"""A workload file that cannot be written whole (a full disk, a file-size limit) is one line,
exit 2, and leaves nothing: no cut file, no ``PATH.partial``, an earlier file as it was.

Before, a failed write of a row was a traceback, and a failure while ``close`` wrote the final
file (the header, then the rows copied from ``PATH.partial``) was a traceback that left the
final file cut (whole lines of it read as a shorter workload) beside the partial one. The file
size limit (``RLIMIT_FSIZE``; Python ignores ``SIGXFSZ``, so a write past it fails with
``EFBIG``) stands for a full disk, in a child process."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from replay.workloads.store import read_workload

ROOT = Path(__file__).resolve().parents[3]


def _import(trace: Path, out: Path, limit_bytes: int | None,
            *extra: str) -> subprocess.CompletedProcess[str]:
    def cap() -> None:
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.RLIM_INFINITY))

    return subprocess.run(
        [sys.executable, "-m", "replay.cli.main", "workload", "import", str(trace),
         "--format", "azure", "--out", str(out), *extra],
        cwd=ROOT, capture_output=True, text=True, preexec_fn=cap, timeout=120)


def _trace(tmp_path: Path, rows: int) -> Path:
    trace = tmp_path / "azure.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:17:{i // 1000:02d}.{i % 1000:03d},{100 + i},{1 + i % 50}"
              for i in range(rows)]
    trace.write_text("\n".join(lines) + "\n")
    return trace


@pytest.mark.parametrize("name", ["w.jsonl", "w.parquet"])
def test_a_write_that_fails_is_one_line_and_leaves_nothing(tmp_path: Path, name: str) -> None:
    """Rows that do not fit: one line naming the file, exit 2, no file of any name left."""
    trace = _trace(tmp_path, 20_000)
    out = tmp_path / "out" / name
    out.parent.mkdir()
    done = _import(trace, out, 64 * 1024)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("replayllm workload: error: ")
    assert str(out) in done.stderr and "File too large" in done.stderr
    assert list(out.parent.iterdir()) == []


def test_a_final_file_that_does_not_fit_leaves_no_cut_file(tmp_path: Path) -> None:
    """The rows fit in ``PATH.partial`` but the final file (the header more) does not: the
    command fails in one line, and neither a cut file nor the partial one is left."""
    trace = _trace(tmp_path, 2_000)
    whole = tmp_path / "whole.jsonl"
    assert _import(trace, whole, None).returncode == 0
    header = len(whole.read_text().splitlines()[0]) + 1
    rows = whole.stat().st_size - header
    out = tmp_path / "out" / "w.jsonl"
    out.parent.mkdir()
    done = _import(trace, out, rows + header // 2)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert list(out.parent.iterdir()) == []


def test_an_earlier_file_is_kept_whole_when_its_rewrite_fails(tmp_path: Path) -> None:
    """A workload file replayllm wrote, imported again into too little room, is left as it was
    (it was cut to the room there was)."""
    small, big = _trace(tmp_path, 50), tmp_path / "big.csv"
    _trace(tmp_path, 20_000).rename(big)
    _trace(tmp_path, 50)
    out = tmp_path / "w.jsonl"
    assert _import(small, out, None).returncode == 0
    before = out.read_bytes()
    done = _import(big, out, 64 * 1024)
    assert done.returncode == 2, done.stderr
    assert out.read_bytes() == before
    assert len(list(read_workload(out))) == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == ["azure.csv", "big.csv", "w.jsonl"]
