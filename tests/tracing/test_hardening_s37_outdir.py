"""Two commands writing one output directory at once: both finish, the later one's output is
what stays, whole, and nothing is lost with an error.

Before: each checked ``--out`` before its work and saw none there; the first to finish renamed
its output into place, and the second's rename then failed (``cannot write (Directory not
empty)``, or ``cannot replace (No such file or directory)`` when both replaced an older one):
exit 2 after the whole run, its output gone (two of four concurrent ``whatif``s here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tracing.outdir import OWNER_FILE, WHATIF, staged_dir

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "cpu-tiny-demo"


def _write(stage: Path, text: str) -> None:
    (stage / "result.txt").write_text(text)


def test_an_output_written_meanwhile_is_replaced_not_a_failed_rename(tmp_path: Path) -> None:
    """The second of two overlapping writers finds the first's output in place at its end."""
    out = tmp_path / "out"
    with staged_dir(out, WHATIF, "test", force=True) as first:
        with staged_dir(out, WHATIF, "test", force=True) as second:
            _write(second, "second")
        _write(first, "first")
    assert (out / "result.txt").read_text() == "first"
    owner = json.loads((out / OWNER_FILE).read_text())
    assert owner["files"] == ["result.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no stage or aside left


def test_concurrent_whatif_commands_into_one_out_all_succeed(tmp_path: Path) -> None:
    """Four ``replayllm whatif`` processes with one ``--out``: each exits 0, and the output
    is one of theirs, whole."""
    out = tmp_path / "same out ü"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "replay.cli.main", "whatif", str(TRACE), "--out", str(out),
         "--no-plots", "--set", f"max_num_seqs={n}"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE) for n in (1, 2, 3, 4)]
    results = [(p.wait(timeout=120), p.stderr.read().decode()) for p in procs]  # type: ignore
    assert all(rc == 0 for rc, _ in results), results
    owner = json.loads((out / OWNER_FILE).read_text())
    assert sorted(p.name for p in out.iterdir()) == sorted([*owner["files"], OWNER_FILE])
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
