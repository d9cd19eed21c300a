"""Output directories: what a command may replace, locks, and writes that never follow a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _trace_helpers import Req, Workload, record, run_engine

from tracing import ParquetRecorder, read_trace
from tracing.errors import TraceError
from tracing.outdir import (
    OWNER_FILE,
    WHATIF,
    OutputDirError,
    staged_dir,
    write_file_atomic,
)


def test_a_planted_tmp_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    """A symlink planted at the temporary name a file is written under: the link is replaced,
    the file it pointed at is untouched."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    final = tmp_path / "out.json"
    (tmp_path / ".out.json.tmp").symlink_to(victim)
    write_file_atomic(final, b"new")
    assert final.read_bytes() == b"new" and victim.read_text() == "precious"
    assert not (tmp_path / ".out.json.tmp").exists()


def test_a_symlink_planted_as_a_kind_directory_is_refused(tmp_path: Path) -> None:
    """A kind directory swapped for a symlink while recording: the segment fails with one
    line naming it; nothing is written where the link points."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    recorder = ParquetRecorder(tmp_path / "t", flush_steps=1, fsync=False, background=False)
    opened = recorder.open

    def open_then_plant(header: dict) -> None:
        opened(header)
        (tmp_path / "t" / "token_sampled").symlink_to(elsewhere)

    recorder.open = open_then_plant  # type: ignore[method-assign]
    with pytest.raises(TraceError, match="token_sampled.*refusing to write through it"):
        run_engine(Workload([Req([1, 2, 3], 3)], num_blocks=8), recorder)
    assert list(elsewhere.iterdir()) == []


def test_a_segment_file_replaced_by_a_symlink_is_refused_by_the_reader(tmp_path: Path) -> None:
    record(Workload([Req([1, 2, 3], 2)], num_blocks=8), tmp_path / "t")
    path = next((tmp_path / "t" / "model_step").glob("seg-*.parquet"))
    outside = tmp_path / "outside.parquet"
    path.rename(outside)
    path.symlink_to(outside)
    with pytest.raises(TraceError, match="symbolic link"):
        read_trace(tmp_path / "t")


def test_an_incomplete_trace_of_ours_is_replaced_without_force(tmp_path: Path) -> None:
    """A killed run's trace (no summary, no lock held) may be recorded over; a complete one
    needs overwrite (``--force``)."""
    record(Workload([Req([1, 2, 3], 2)], num_blocks=8), tmp_path / "t")
    (tmp_path / "t" / "summary.json").unlink()
    record(Workload([Req([5], 1)], num_blocks=8), tmp_path / "t")
    assert read_trace(tmp_path / "t").complete


def test_staged_dir_leaves_nothing_on_failure_and_replaces_its_own_output(tmp_path: Path) -> None:
    out = tmp_path / "w"
    with pytest.raises(RuntimeError), staged_dir(out, WHATIF, "test", force=True) as stage:
        (stage / "a.parquet").write_text("half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with staged_dir(out, WHATIF, "test", force=True) as stage:
        (stage / "a.parquet").write_text("one")
    with staged_dir(out, WHATIF, "test", force=True) as stage:
        (stage / "b.parquet").write_text("two")
    assert sorted(p.name for p in out.iterdir()) == [OWNER_FILE, "b.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]


def test_staged_dir_never_replaces_a_directory_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "w"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    with pytest.raises(OutputDirError, match="did not write"), \
            staged_dir(out, WHATIF, "test", force=True):
        pass
    assert (out / "mine.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["w"]


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["022", "027"])
def test_an_output_written_whole_gets_a_new_directorys_mode(tmp_path: Path, umask: int) -> None:
    """``make-model``, ``whatif --out`` and ``tune --out`` write into a ``mkdtemp`` stage,
    which is private (0700): renamed into place, the checkpoint or result stayed unreadable
    to anyone but its writer (a serving account, a teammate), its files' 0644 notwithstanding.
    The directory now gets the mode ``mkdir`` gives under the umask, as a trace's has."""
    previous = os.umask(umask)
    try:
        with staged_dir(tmp_path / "new", WHATIF, "test", force=True) as stage:
            (stage / "a.parquet").write_text("one")
        (tmp_path / "empty").mkdir()  # an empty directory given as the output is replaced
        with staged_dir(tmp_path / "empty", WHATIF, "test", force=True) as stage:
            (stage / "a.parquet").write_text("one")
    finally:
        os.umask(previous)
    for name in ("new", "empty"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o777 & ~umask, name
