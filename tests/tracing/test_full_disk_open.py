"""A trace directory on a full disk fails at open in one ``TraceError`` line, and leaves the
directory unlocked, so the same process can record there once space is freed.

Before: the lock file's pid line was written unguarded, so a full disk raised a bare ``OSError``
(a traceback from ``replayllm run``), and a failed open kept the directory's lock: a retry in the
same process was refused as "being recorded by another process" -- its own.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tracing.errors import TraceError
from tracing.events import EventBuffer
from tracing.outdir import LOCK_FILE, lock_holder
from tracing.recorder import ParquetRecorder

HEADER = {"config": {}, "block_size": 4, "num_blocks": 8}


def _full_disk(monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> None:
    """``os.write`` to a file whose name holds one of ``names`` fails as on a full disk."""
    real = os.write

    def write(fd: int, data: bytes) -> int:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if any(part in name for part in names):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("names", [(LOCK_FILE,), ("run.json",), ("replayllm-output",)])
def test_a_full_disk_at_open_is_one_trace_error_and_frees_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> None:
    if not os.path.exists("/proc/self/fd"):
        pytest.fail("needs /proc/self/fd to tell the files apart")
    trace = tmp_path / "t"
    with monkeypatch.context() as patch:
        _full_disk(patch, names)
        with pytest.raises(TraceError) as failed:
            ParquetRecorder(trace).open(HEADER)
    message = str(failed.value)
    assert "\n" not in message and "No space left on device" in message, message
    assert lock_holder(trace) is None  # nobody holds it: the failed recorder let it go
    recorder = ParquetRecorder(trace, overwrite=True)
    recorder.open(HEADER)  # space is back: the same process records there
    recorder.close(EventBuffer(), {"steps": 0})
    assert (trace / "summary.json").is_file()
