"""``tracing.outfile.check_output_file`` and ``tracing.outdir.output_dir_above``: the one rule
for where a file output may go."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracing.outdir import OutputDirError, check_output_dir, output_dir_above, write_owner
from tracing.outfile import check_output_file, starts_with, write_via_temporary


def _never(_: Path) -> bool:
    return False


def test_a_run_json_alone_is_not_a_trace(tmp_path: Path) -> None:
    """Only a header beside _commits/ (or an owner record) makes a directory an output: a
    project folder holding some other tool's run.json keeps taking outputs."""
    (tmp_path / "run.json").write_text("{}")
    assert output_dir_above(tmp_path / "x.html") is None
    check_output_file(tmp_path / "x.html", "report", _never)
    (tmp_path / "_commits").mkdir()
    assert output_dir_above(tmp_path / "sub" / "x.html") == tmp_path.resolve()


def test_inside_an_owned_output_only_its_own_names(tmp_path: Path) -> None:
    """In a replayllm output directory only the names given for it may be written, and only
    at its top level."""
    out = tmp_path / "o"
    out.mkdir()
    write_owner(out, "whatif", "whatif")
    check_output_file(out / "trace.json", "export", _never, own_dir=out,
                      own_names=frozenset({"trace.json"}))
    for path in (out / "other.json", out / "sub" / "trace.json"):
        with pytest.raises(OutputDirError, match="inside"):
            check_output_file(path, "export", _never, own_dir=out,
                              own_names=frozenset({"trace.json"}))


def test_existing_files(tmp_path: Path) -> None:
    """An earlier output is replaced; another file only with force (and never without the flag
    for commands that have none); a directory or a symlink never."""
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"my": 1}))
    with pytest.raises(OutputDirError, match="remove it yourself"):
        check_output_file(mine, "report", _never)
    with pytest.raises(OutputDirError, match="--force"):
        check_output_file(mine, "export", _never, force=False)
    check_output_file(mine, "export", _never, force=True)
    check_output_file(mine, "report", starts_with(b'{"my"'))
    with pytest.raises(OutputDirError, match="not a regular file"):
        check_output_file(tmp_path, "report", _never)
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(OutputDirError, match="symbolic link"):
        check_output_file(tmp_path / "link", "report", _never)


def test_write_via_temporary_leaves_the_old_file_on_failure(tmp_path: Path) -> None:
    """A writer that fails half-way leaves the old file whole and no temporary behind; an
    OSError (a full disk) is one OutputDirError line."""
    out = tmp_path / "r.html"
    out.write_text("old")

    def half(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputDirError, match="No space left on device"):
        write_via_temporary(out, half)
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.html"]
    write_via_temporary(out, lambda tmp: tmp.write_text("new"))
    assert out.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_a_parent_that_is_a_file_or_not_writable_is_refused(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """An output under a path whose nearest existing ancestor is a file (`--out notes.txt/x`)
    or a directory this process may not write in passed the check, and the command failed only
    when it wrote, after its work (whatif, tune, profile, loadgen: the results lost; a plot:
    a FileExistsError traceback). Now refused by both checks before anything runs; a missing
    directory, made at write time, is still fine."""
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    for path in (notes / "o.html", notes / "a" / "b" / "o.html"):
        with pytest.raises(OutputDirError, match="notes.txt is a file, not a directory"):
            check_output_file(path, "report", _never)
        with pytest.raises(OutputDirError, match="notes.txt is a file, not a directory"):
            check_output_dir(path, "whatif", force=True)
    check_output_file(tmp_path / "new" / "deeper" / "o.html", "report", _never)
    assert not check_output_dir(tmp_path / "new" / "deeper", "whatif", force=True)
    import tracing.outdir as outdir

    monkeypatch.setattr(outdir.os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(OutputDirError, match="no permission to write in"):
        check_output_file(tmp_path / "o.html", "report", _never)
    with pytest.raises(OutputDirError, match="no permission to write in"):
        check_output_dir(tmp_path / "sub" / "o", "whatif", force=True)


def test_a_read_only_file_system_is_named_as_such(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An output under a directory of a read-only mount said "no permission to write in",
    which sends a user after the directory's mode, not the mount; `statvfs`'s read-only flag
    now names the file system (`access` denies either way)."""
    import os

    import tracing.outdir as outdir

    real = os.statvfs(tmp_path)

    class ReadOnly:
        f_flag = real.f_flag | os.ST_RDONLY

    monkeypatch.setattr(outdir.os, "access", lambda path, mode: Path(path) != tmp_path)
    monkeypatch.setattr(outdir.os, "statvfs", lambda path: ReadOnly())
    for check in (lambda: check_output_file(tmp_path / "o.html", "report", _never),
                  lambda: check_output_dir(tmp_path / "sub" / "o", "export", force=True)):
        with pytest.raises(OutputDirError, match="is on a read-only file system"):
            check()
