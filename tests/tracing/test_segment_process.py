"""tracing/segment_process.py: the writer process commits what the engine hands it, in order,
cleans up after itself, and a writer process that dies is one clear error, never a hang."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from _trace_helpers import run_engine

from tracing import ParquetRecorder, TraceError, read_trace
from tracing.events import EventBuffer
from tracing.layout import COMMITS_DIR


def test_the_staging_folder_is_gone_after_close(tmp_path: Path) -> None:
    """The staging folder (a few reused files of Arrow IPC streams) is removed at close."""
    from _trace_helpers import reference_like

    recorder = ParquetRecorder(tmp_path / "t", flush_steps=3, fsync=False, writer="process")
    staged: list[Path] = []
    opened = recorder.open

    def open_and_note(header: dict) -> None:
        opened(header)
        staged.append(recorder._writer._staging)  # type: ignore[union-attr]

    recorder.open = open_and_note  # type: ignore[method-assign]
    run_engine(reference_like(8), recorder)
    assert staged and not staged[0].exists()
    assert read_trace(tmp_path / "t").complete


def test_a_writer_process_that_dies_is_a_trace_error(tmp_path: Path) -> None:
    """Killing the child mid-run: a later step end (or close) raises TraceError naming the
    writer process; what it committed before still reads."""
    recorder = ParquetRecorder(tmp_path / "t", flush_steps=1, fsync=False, writer="process")
    recorder.open({"model": {"architecture": "null"}})
    buffer = EventBuffer()

    def one_step() -> None:
        buffer.emit_tokens_sampled([0], [5])
        buffer.step += 1
        recorder.on_step_end(buffer)  # flush_steps=1: a segment per step

    one_step()
    deadline = time.monotonic() + 30
    while not list((tmp_path / "t" / COMMITS_DIR).glob("*.json")):
        assert time.monotonic() < deadline, "the writer process committed nothing"
        time.sleep(0.01)
    pid = recorder.writer_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(TraceError, match="trace writer process ended"):
        for _ in range(100):  # the pipe reports the death at the next write into it
            one_step()
            time.sleep(0.01)
    with pytest.raises(TraceError):
        recorder.close(buffer, {})
    assert read_trace(tmp_path / "t").segments >= 1


def test_config_trace_segment_writer_reaches_the_recorder(tmp_path: Path) -> None:
    """``Config.trace_segment_writer`` picks the recorder's writer; a bad name is a ConfigError."""
    from engine import LLM
    from engine.errors import ConfigError
    from engine.sampling_params import SamplingParams

    llm = LLM(None, trace_dir=str(tmp_path / "t"), trace_segment_writer="process")
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    llm.close()
    trace = read_trace(tmp_path / "t")
    assert trace.complete and trace.summary["recorder"]["writer"] == "process"
    assert trace.header["config"]["trace_segment_writer"] == "process"
    with pytest.raises(ConfigError, match="trace_segment_writer"):
        LLM(None, trace_dir=str(tmp_path / "u"), trace_segment_writer="fork")
