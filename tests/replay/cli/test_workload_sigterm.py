"""SIGTERM (``timeout``, ``kill``, a job scheduler) stops ``replayllm workload
generate`` and ``import`` as Ctrl-C does: the rows written so far (``OUT.partial``) are removed,
a file already at ``OUT`` is left as it was, one line on stderr, exit 143 (128 + SIGTERM, as
``replayllm run`` ends on it: ``replay.cli.interrupt``). Each command runs in a child process,
signalled once its partial file has grown."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

# An earlier workload at OUT (the one kind of file the commands replace).
OLD = '{"replayllm_workload": 1}\n{"prompt_token_ids": [7], "max_tokens": 1}\n'
WAIT_S = 60


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "replay.cli.main", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_rows(partial: Path, child: subprocess.Popen[str]) -> None:
    """Until ``partial`` holds some rows (the command is mid-write)."""
    deadline = time.monotonic() + WAIT_S
    while not (partial.exists() and partial.stat().st_size > 0):
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "no partial file appeared"
        time.sleep(0.02)


def _stop(child: subprocess.Popen[str], signum: int) -> tuple[int, str]:
    child.send_signal(signum)
    _, err = child.communicate(timeout=WAIT_S)
    return child.returncode, err


@pytest.mark.parametrize("signum,status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_generate_leaves_no_partial_and_the_old_file(
        signum: int, status: int, tmp_path: Path) -> None:
    """SIGTERM while a large workload is generated: no ``OUT.partial`` left, the file that
    was at ``OUT`` unchanged, one line naming the signal, exit 143. Before: SIGTERM killed the
    process (status -15, no line) and left ``OUT.partial`` (gigabytes, for a large run). Ctrl-C
    (SIGINT) did, and does, the same clean-up with 130."""
    out = tmp_path / "w.jsonl"
    out.write_text(OLD)
    child = _start(["workload", "generate", "--out", str(out), "--num-requests", str(10**8)])
    _wait_for_rows(tmp_path / "w.jsonl.partial", child)
    code, err = _stop(child, signum)
    assert code == status, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.jsonl"]
    assert out.read_text() == OLD
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in err, err
    if signum == signal.SIGTERM:
        assert "SIGTERM" in lines[0]


def test_sigterm_mid_import_leaves_no_partial(tmp_path: Path) -> None:
    """The same for ``workload import`` (it writes through the same ``OUT.partial``): its source
    a pipe the test feeds slowly, signalled while it waits for more rows. Before: killed,
    ``OUT.partial`` left behind."""
    source, out = tmp_path / "src.jsonl", tmp_path / "w.jsonl"
    os.mkfifo(source)
    child = _start(["workload", "import", str(source), "--format", "replayllm",
                    "--out", str(out)])
    stop = threading.Event()

    def feed() -> None:  # a header, then rows until told to stop or the reader is gone
        with contextlib.suppress(BrokenPipeError), open(source, "w") as pipe:
            pipe.write(json.dumps({"replayllm_workload": 1}) + "\n")
            while not stop.is_set():
                pipe.write(json.dumps({"prompt_token_ids": [1, 2], "max_tokens": 2}) + "\n")
                pipe.flush()
                time.sleep(0.001)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        _wait_for_rows(tmp_path / "w.jsonl.partial", child)
        code, err = _stop(child, signal.SIGTERM)
    finally:
        stop.set()
    assert code == 143, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.jsonl"]
    assert "SIGTERM" in err and "Traceback" not in err, err
