"""A copy of a trace taken while it is still being recorded reads as the prefix it holds whole.

``cp -r`` copies each directory at another moment: the event kinds' directories first, the
commit markers later (or the other way round). Where a marker was copied after its files'
directory was, the copy holds the marker without the files, or a file the writer was still
writing. The reader used to refuse such a copy ("missing, but committed by ..."); since every
segment before the first unfinished one is whole (segments commit in order), it now reads as
that prefix and says which segments it left unread and why. A complete trace (a summary) with a
file missing is still damage."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _trace_helpers import FakeClock, _params, record, reference_like

from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from replay.cli.main import main
from replay.verify import verify
from tracing import TraceError, read_trace
from tracing.inspect import describe, summarize
from tracing.layout import COMMITS_DIR, HEADER_FILE
from tracing.recorder import ParquetRecorder
from tracing.schema import EVENT_KINDS

CAUGHT_STEPS = 6  # steps recorded when the copy took the kinds' directories
LATER_STEPS = 3  # steps recorded after that, before it took the commit markers


def _copy_mid_recording(tmp_path: Path, partial: bool) -> tuple[Path, Path]:
    """Record step by step (one segment a step); copy the kind directories after
    ``CAUGHT_STEPS`` steps and the markers ``LATER_STEPS`` steps later, as ``cp -r`` does when it
    lists ``_commits`` last. ``partial``: the copy also caught the next segment's file half
    written (under its temporary name). Returns (the source, finished; the copy)."""
    workload = reference_like(8)
    source, copy = tmp_path / "src", tmp_path / "copy"
    recorder = ParquetRecorder(source, flush_steps=1, background=False, fsync=False)
    core = EngineCore(workload.config(), NullExecutor(workload.num_blocks, vocab_size=1000),
                      sink=recorder, clock=FakeClock(),
                      header={"model": {"architecture": "null"}, "device": "cpu: test"})
    for req in workload.requests:
        core.add_request(req.prompt, _params(req))
    for _ in range(CAUGHT_STEPS):
        core.step()
    copy.mkdir()
    for kind in EVENT_KINDS:
        if (source / kind).is_dir():
            shutil.copytree(source / kind, copy / kind)
    for _ in range(LATER_STEPS):
        core.step()
    if partial:
        # The next segment's files were copied whole (their directories copied later), but for
        # its token_sampled file, caught half written under its temporary name.
        name = f"seg-{CAUGHT_STEPS:06d}.parquet"
        for kind in EVENT_KINDS:
            if (source / kind / name).exists():
                shutil.copy(source / kind / name, copy / kind / name)
        whole = (copy / "token_sampled" / name).read_bytes()
        (copy / "token_sampled" / f".{name}.tmp").write_bytes(whole[: len(whole) // 2])
        (copy / "token_sampled" / name).unlink()
    shutil.copytree(source / COMMITS_DIR, copy / COMMITS_DIR)
    shutil.copy(source / HEADER_FILE, copy / HEADER_FILE)
    core.run_until_idle()
    core.close()
    return source, copy


@pytest.mark.parametrize("partial", [False, True], ids=["files-missing", "file-half-written"])
def test_a_copy_taken_mid_recording_reads_as_its_whole_prefix(
    tmp_path: Path, partial: bool, capsys: pytest.CaptureFixture[str],
) -> None:
    """The copy reads, inspects and verifies as the segments caught whole (steps 0 to
    ``CAUGHT_STEPS - 1``), its rows equal to the finished recording's rows of those steps, and
    every reader names the segments it left unread."""
    source, copy = _copy_mid_recording(tmp_path, partial)
    trace = read_trace(copy)
    assert not trace.complete
    assert trace.last_step == CAUGHT_STEPS - 1
    assert trace.segments == CAUGHT_STEPS
    assert trace.unread is not None
    assert (trace.unread.first, trace.unread.last) == (CAUGHT_STEPS,
                                                        CAUGHT_STEPS + LATER_STEPS - 1)
    note = trace.unread_note
    assert note is not None and "\n" not in note
    assert f"segments {CAUGHT_STEPS} to {CAUGHT_STEPS + LATER_STEPS - 1}" in note
    assert f"through step {CAUGHT_STEPS - 1}" in note
    assert ("cut short" in note or "truncated" in note) if partial else "missing" in note
    full = read_trace(source)
    for kind in EVENT_KINDS:
        want = full.table(kind).filter(full.table(kind).column("step").to_numpy()
                                       <= CAUGHT_STEPS - 1)
        assert trace.table(kind).equals(want), kind
    assert summarize(trace)["unread"] == note
    text = describe(trace)
    assert f"note: {note}" in text
    assert f"INCOMPLETE (read through step {CAUGHT_STEPS - 1}; see the note below)" in text
    result = verify(copy)
    assert result.identical and result.last_step == CAUGHT_STEPS - 1
    assert note in result.report()
    assert main(["verify", str(copy)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("identical:") and note in out
    for fmt, name in (("perfetto", "t.json"), ("vllm-kv-events", "t.kv")):
        assert main(["export", str(copy), "--format", fmt, "--out", str(tmp_path / name)]) == 0
        assert f"note: {note}" in capsys.readouterr().out
    assert main(["export", str(copy), "--out", "-"]) == 0
    assert f"note: {note}" in capsys.readouterr().err


def test_a_copy_with_no_whole_segment_has_nothing_to_verify(tmp_path: Path) -> None:
    """A copy that caught segment 0's marker but none of its files: no segment read, and
    verify's one line says why rather than call zero steps identical."""
    source = tmp_path / "t"
    record(reference_like(4), source, flush_steps=2)
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    (copy / "summary.json").unlink()
    for kind in EVENT_KINDS:
        shutil.rmtree(copy / kind, ignore_errors=True)
    trace = read_trace(copy)
    assert trace.segments == 0 and trace.last_step == -1 and trace.num_events == 0
    assert trace.unread is not None and trace.unread.first == 0
    with pytest.raises(TraceError, match="read no segment: nothing to verify"):
        verify(copy)


def test_a_complete_trace_missing_a_file_is_still_damage(tmp_path: Path) -> None:
    """With its summary (the recording closed, every segment counted) a missing or cut file
    is refused in one line, never read as a shorter trace."""
    trace_dir = tmp_path / "t"
    record(reference_like(6), trace_dir, flush_steps=3)
    last = read_trace(trace_dir).segments - 1
    seg = trace_dir / "token_sampled" / f"seg-{last:06d}.parquet"
    seg.write_bytes(seg.read_bytes()[:50])
    with pytest.raises(TraceError, match="truncated or corrupted"):
        read_trace(trace_dir)
    seg.unlink()
    with pytest.raises(TraceError, match="missing, but committed"):
        read_trace(trace_dir)


def test_whatif_and_assert_replays_name_what_a_copy_left_unread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """whatif's warning on an incomplete source and ``replay.testing.assert_replays``' warning
    say which segments a copy taken mid-recording left unread, as verify and inspect do; they
    said only "the recording stopped", which a copy's recording never did."""
    from replay.testing import assert_replays
    from replay.testing.replays import IncompleteTraceWarning

    _, copy = _copy_mid_recording(tmp_path, partial=False)
    note = read_trace(copy).unread_note
    assert note is not None
    assert main(["whatif", str(copy), "--set", "max_num_seqs=4", "--out", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert f"warning: {copy} is incomplete ({note})" in out
    with pytest.warns(IncompleteTraceWarning) as caught:
        assert_replays(copy)
    assert note in str(caught[0].message)
