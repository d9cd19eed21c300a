"""Helpers for CLI tests: run ``replayllm`` in-process, read what it printed, snapshot files."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from replay.cli.main import main
from tracing.outdir import TRACE, write_owner

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "traces" / "cpu-tiny-demo"
# A request the tiny model serves in a few steps.
TINY_REQUEST = {"prompt_token_ids": [1, 2, 3], "max_tokens": 2, "temperature": 0.0}
# A progress bar's redraws (tqdm): not lines of output.
_PROGRESS = re.compile(r"(\d+/\d+ \[|it/s\]|s/it\]|^start-up)")


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``replayllm ARGV`` in this process: (exit status, stdout, stderr). Any exception other
    than ``SystemExit`` propagates: a traceback fails the calling test."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: a usage error
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def message_lines(stderr: str) -> list[str]:
    """The lines a user reads on stderr, progress-bar redraws left out."""
    lines = []
    for line in stderr.split("\n"):
        parts = [p for p in line.split("\r") if p.strip() and not _PROGRESS.search(p)]
        lines += parts
    return lines


def owned_trace(dest: Path, source: Path = SAMPLE) -> Path:
    """A copy of ``source`` that a replayllm recorder claims (its owner record written)."""
    shutil.copytree(source, dest)
    write_owner(dest, TRACE, "run")
    return dest


def user_policy_copy(dest: Path, policy: str, source: Path = SAMPLE) -> Path:
    """``source`` copied to ``dest`` as if recorded with the user policy ``policy`` (a module
    that cannot be imported here)."""
    shutil.copytree(source, dest)
    header = json.loads((dest / "run.json").read_text())
    header["config"]["policy"] = header["policy"] = policy
    (dest / "run.json").write_text(json.dumps(header))
    return dest


def snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Relative path -> content digest (or link target) of everything under ``root``, never
    following a link, leaving out the top-level names in ``skip`` (a command's own output)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        for name in sorted(dirnames + filenames):
            path = here / name
            rel = path.relative_to(root)
            if rel.parts[0] in skip:
                continue
            if path.is_symlink():
                out[str(rel)] = "-> " + os.readlink(path)
            elif path.is_file():
                out[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[str(rel)] = "dir"
        dirnames[:] = [d for d in dirnames
                       if (here / d).relative_to(root).parts[0] not in skip
                       and not (here / d).is_symlink()]
    return out


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def one_error(err: str, *needles: str) -> str:
    """The one message line on ``err`` (asserted to be one, no traceback, holding ``needles``)."""
    lines = message_lines(err)
    assert len(lines) == 1, lines
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def corrupt_copy(tmp_path: Path, edit: Callable[[Path], object]) -> Path:
    """A copy of the sample trace at ``tmp_path / "t"``, changed by ``edit``."""
    trace = tmp_path / "t"
    shutil.copytree(SAMPLE, trace)
    edit(trace)
    return trace


def killed_copy(trace: str | Path, dest: Path, keep: int) -> str:
    """``trace`` as a killed run leaves it: no summary.json, only its first ``keep`` markers."""
    shutil.copytree(trace, dest)
    (dest / "summary.json").unlink()
    for marker in sorted((dest / "_commits").glob("seg-*.json"))[keep:]:
        marker.unlink()
    return str(dest)
