"""``tools/compact_trace.py SRC DST``: every user error one line on stderr and exit 2, the
trace at SRC (and whatever is at DST) untouched; a compacted trace is SRC's.

Before: any ``TraceError`` (SRC missing or damaged, DST holding a trace or a file) escaped as a
traceback, an incomplete SRC exited 1; and a SRC of an older schema version was rewritten under
the current version's number (the recorder writes its own), its filled-in columns presented as
recorded and verify comparing columns that version never stored (``COMPARED_SINCE``).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replay.verify import verify
from tests.replay.cli._cli import SAMPLE
from tests.tracing._trace_helpers import record, reference_like
from tools.compact_trace import main
from tracing import read_trace
from tracing.schema import EVENT_KINDS, SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[2]


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int, *words: str) -> None:
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("compact_trace: error: ")
    for word in words:
        assert word in err


def test_compacts_a_trace_of_this_version(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    record(reference_like(), src, flush_steps=5)
    before = _digest(src)
    assert main([str(src), str(dst)]) == 0
    old, new = read_trace(src), read_trace(dst)
    assert new.segments == 1 < old.segments
    assert new.header["schema_version"] == SCHEMA_VERSION
    for kind in EVENT_KINDS:
        assert new.table(kind).equals(old.table(kind)), kind
    assert verify(dst).identical
    assert _digest(src) == before


def test_an_older_version_is_refused_not_relabelled(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "dst"
    code = main([str(SAMPLE), str(dst)])
    _one_line_error(capsys, code, f"{SAMPLE}: schema version 1", f"version {SCHEMA_VERSION}")
    assert not dst.exists()


@pytest.mark.parametrize("case", ["missing", "incomplete", "damaged"])
def test_a_source_that_is_not_a_complete_trace(tmp_path: Path, case: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    if case != "missing":
        record(reference_like(), src, flush_steps=5)
        if case == "incomplete":
            (src / "summary.json").unlink()
        else:
            (src / "model_step" / "seg-000001.parquet").write_bytes(b"not parquet")
    code = main([str(src), str(tmp_path / "dst")])
    _one_line_error(capsys, code, str(src))
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize("what", ["trace", "file", "same"])
def test_a_destination_in_use_is_left_alone(tmp_path: Path, what: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    record(reference_like(), src, flush_steps=5)
    dst = {"trace": tmp_path / "other", "file": tmp_path / "notes.txt", "same": src}[what]
    if what == "trace":
        shutil.copytree(src, dst)
    elif what == "file":
        dst.write_text("keep me")
    before = _digest(dst) if dst.is_dir() else dst.read_text()
    code = main([str(src), str(dst)])
    _one_line_error(capsys, code, str(dst))
    assert (_digest(dst) if dst.is_dir() else dst.read_text()) == before


def test_the_script_usage(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "tools/compact_trace.py", str(tmp_path / "nope")],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr == "usage: python tools/compact_trace.py SRC DST\n"
    done = subprocess.run([sys.executable, "tools/compact_trace.py", str(tmp_path / "nope"),
                           str(tmp_path / "dst")], cwd=REPO, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 2
    assert done.stderr == f"compact_trace: error: {tmp_path / 'nope'}: no such trace directory\n"
