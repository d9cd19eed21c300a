"""Two recorders of one process on the same trace directory: the second is refused saying the
holder is this process's own engine, to be closed (before: only "another process (pid N)", which
sent a user hunting for a process that does not exist).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tracing.errors import TraceError
from tracing.events import EventBuffer
from tracing.recorder import ParquetRecorder, check_trace_dir

HEADER = {"config": {}, "block_size": 4, "num_blocks": 8}


def test_a_second_recorder_of_this_process_is_told_to_close_the_first(tmp_path: Path) -> None:
    trace = tmp_path / "t"
    first = ParquetRecorder(trace)
    first.open(HEADER)
    for attempt in (lambda: check_trace_dir(trace, False),
                    lambda: ParquetRecorder(trace).open(HEADER)):
        with pytest.raises(TraceError) as refused:
            attempt()
        message = str(refused.value)
        assert f"(pid {os.getpid()}: this one, by an engine not closed yet; close() it first)" \
            in message, message
    first.close(EventBuffer(), {"steps": 0})
    assert (trace / "summary.json").is_file()  # the first one's trace is whole
