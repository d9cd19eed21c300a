"""Early stop of ``workload import`` (``Gate.closed``): a source whose rows are in time order
stops reading once no later row can be kept (its row at or past ``--end``, or ``--limit`` first
turns kept), so ``--limit 10`` of Azure 2024's 16.8-million-row trace no longer reads it whole
(4 minutes). These prove: the rows after the stop are never read (malformed ones there import
fine; a file that counts its lines shows the reader stopped within its first chunk); the requests
written are a full read's, byte for byte, in every format; the counts, the summary and the
header say where reading stopped (the header is unchanged where it did not); the rows read are
still held to time order; conversation formats stop only where no later turn can be kept (a
workload file whose kept conversation may continue reads on); and an import that keeps nothing
reads on, for the error naming the whole trace's span."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replay.cli.main import main
from replay.workloads import csv_sources
from replay.workloads.fields import WorkloadFormatError
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload, select, source
from replay.workloads.request import Request
from replay.workloads.store import WorkloadWriter, read_metadata

TRACES = Path(__file__).parents[3] / "traces/workloads"
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
GOOD = [f"2024-05-10 00:00:{s:02d}.5000000,{100 + s},{10 + s}" for s in range(6)]
# Rows that make a full read fail, each put after GOOD[:5] (lines 2 to 6; the sixth row)
MALFORMED = {"time": "yesterday,100,10", "count": "2024-05-10 00:00:09,1e400,10",
             "fields": "2024-05-10 00:00:09,100", "quote": '2024-05-10 00:00:09,"100,10',
             "order": "2024-05-10 00:00:01,100,10", "form": "1715299209,100,10"}


def azure(tmp_path: Path, rows: list[str], name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def run(path: Path, fmt: str = "azure", **options: Any) -> tuple[list[Request], ImportCounts]:
    counts = ImportCounts()
    return list(import_workload(path, fmt, ImportOptions(**options), counts)), counts


def full_read(path: Path, fmt: str, **options: Any) -> tuple[list[Request], ImportCounts]:
    """The import as it was before the early stop: the source given no gate reads to its end."""
    counts, opts = ImportCounts(), ImportOptions(**options)
    return list(select(source(path, fmt, opts), opts, counts, path)), counts


def written(requests: list[Request], path: Path) -> bytes:
    """The requests' lines of a JSONL workload file written from them (after its header)."""
    writer = WorkloadWriter(path)
    writer.write_all(requests)
    writer.close()
    return path.read_bytes().split(b"\n", 1)[1]


@pytest.mark.parametrize("kind", sorted(MALFORMED))
@pytest.mark.parametrize(("options", "line", "read"), [({"limit": 3}, 4, 3),
                                                        ({"end_s": 2.5}, 5, 4)])
def test_rows_after_the_stop_are_never_read(tmp_path: Path, kind: str, options: dict,
                                            line: int, read: int) -> None:
    """A malformed row after the stop (a bad time or count, a cut row, a quote never closed, a
    row out of time order, a time of another form), in the same chunk as the rows kept, fails
    a full read but not an import that stops before it: it is neither read nor counted."""
    path = azure(tmp_path, [*GOOD[:5], MALFORMED[kind], *GOOD[5:]])
    with pytest.raises(WorkloadFormatError, match=rf"{path}:7: "):
        run(path)
    requests, counts = run(path, **options)
    assert [(r.arrival_s, len(r.prompt)) for r in requests] == [(0.0, 100), (1.0, 101),
                                                                (2.0, 102)]
    assert (counts.read, counts.kept) == (read, 3)
    assert counts.stopped is not None and counts.stopped.startswith(
        f"stopped reading at {path}:{line} (")
    assert f"{path}:{line} (" in counts.describe()


class CountingText:
    """A text file that counts the lines taken from it."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.lines = handle, 0

    def __iter__(self) -> CountingText:
        return self

    def __next__(self) -> str:
        line = next(self.handle)
        self.lines += 1
        return line

    def __enter__(self) -> CountingText:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()


@pytest.mark.parametrize("options", [{"limit": 10}, {"end_s": 1.0}, {"start_s": 3.0,
                                                                    "end_s": 4.0}])
def test_the_reader_stops_within_its_first_chunk(tmp_path: Path, monkeypatch,
                                                  options: dict) -> None:
    """20,000 rows, 10 a second: an import keeping the first 10, or a few seconds' worth,
    takes no more lines from the file than its first chunk (``FIRST_CHUNK_ROWS``), not all."""
    rows = [f"{1715299200 + i / 10:.1f},{1 + i % 50},{i % 7}" for i in range(20_000)]
    path = azure(tmp_path, rows)
    opened: list[CountingText] = []
    real = csv_sources.open_text

    def counting(*args: Any, **kwargs: Any) -> CountingText:
        opened.append(CountingText(real(*args, **kwargs)))
        return opened[-1]

    monkeypatch.setattr(csv_sources, "open_text", counting)
    requests, counts = run(path, **options)
    assert len(requests) == 10 and counts.kept == 10 and counts.read <= 51
    assert opened and opened[0].lines <= csv_sources.FIRST_CHUNK_ROWS + 1
    monkeypatch.undo()
    everything, all_counts = full_read(path, "azure", **options)
    assert everything == requests and all_counts.read == 20_000


def burstgpt(tmp_path: Path) -> Path:
    path = tmp_path / "BurstGPT.csv"
    rows = [f"{i * 0.75:g},{'GPT-4' if i % 3 else 'ChatGPT'},{(i * 37) % 900},"
            f"{0 if i % 5 == 4 else i % 300},0,Conversation log" for i in range(400)]
    path.write_text("\n".join(["Timestamp,Model,Request tokens,Response tokens,Total tokens,"
                               "Log Type", *rows]) + "\n")
    return path


def sharegpt(tmp_path: Path) -> Path:
    path = tmp_path / "sg.jsonl"
    entries = [{"id": f"c{i}", "conversations": [
        {"from": "human" if k % 2 == 0 else "gpt", "value": f"turn {k} of {i} " * (1 + k)}
        for k in range(2 * (1 + i % 3) - (i % 4 == 3))]} for i in range(60)]
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def workload(tmp_path: Path) -> Path:
    """A workload file of single requests (no conversation): an Azure import's."""
    path = tmp_path / "w.jsonl"
    written(full_read(TRACES / "AzureLLMInferenceTrace_code.csv", "azure", limit=300)[0], path)
    return path


CASES = [("azure", {"limit": 7}), ("azure", {"end_s": 30.0}),
         ("azure", {"start_s": 20.0, "end_s": 200.0, "limit": 40, "time_scale": 0.5}),
         ("azure", {"end_s": 100.0, "max_prompt_len": 2000, "over_length": "clip"}),
         ("mooncake", {"limit": 25, "block_size": 16}), ("mooncake", {"start_s": 10.0,
                                                                      "end_s": 60.0}),
         ("burstgpt", {"limit": 30}), ("burstgpt", {"end_s": 40.0, "filter_model": "gpt-4"}),
         ("burstgpt", {"start_s": 5.0, "end_s": 45.0, "filter_model": "ChatGPT", "limit": 9}),
         ("sharegpt", {"limit": 4}), ("sharegpt", {"rate": 2.0, "end_s": 6.0, "seed": 3}),
         ("sharegpt", {"rate": 1.0, "start_s": 2.0, "end_s": 20.0, "limit": 5}),
         ("replayllm", {"limit": 12}), ("replayllm", {"limit": 3, "time_scale": 2.0})]


@pytest.mark.parametrize(("fmt", "options"), CASES)
def test_the_requests_written_are_a_full_reads_byte_for_byte(tmp_path: Path, fmt: str,
                                                             options: dict) -> None:
    """In every format, the requests an import that stops writes are those of a full read,
    byte for byte; only the counts of what was read and dropped shrink, and say where."""
    path = {"azure": lambda: TRACES / "AzureLLMInferenceTrace_code.csv",
            "mooncake": lambda: TRACES / "mooncake_synthetic_trace.jsonl",
            "burstgpt": lambda: burstgpt(tmp_path), "sharegpt": lambda: sharegpt(tmp_path),
            "replayllm": lambda: workload(tmp_path)}[fmt]()
    requests, counts = run(path, fmt, **options)
    everything, all_counts = full_read(path, fmt, **options)
    assert written(requests, tmp_path / "a.jsonl") == written(everything, tmp_path / "b.jsonl")
    assert counts.kept == all_counts.kept == len(requests) > 0
    assert counts.changed == all_counts.changed
    assert counts.read < all_counts.read and all_counts.stopped is None
    assert counts.read == counts.kept + sum(counts.dropped.values())
    assert counts.stopped is not None and counts.stopped.startswith("stopped reading at ")
    assert str(path) in counts.stopped and counts.stopped in counts.describe()


def test_the_summary_and_the_header_say_where_reading_stopped(tmp_path: Path, capsys) -> None:
    """The command's line and the file's ``imported`` header name the row reading stopped at
    and why; an import that read everything prints and records no such thing (its header as
    before: no ``stopped`` key)."""
    path = azure(tmp_path, GOOD)
    out = tmp_path / "out.jsonl"
    assert main(["workload", "import", str(path), "--format", "azure", "--out", str(out),
                 "--limit", "2"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote 2 requests to {out}: read 2, kept 2; stopped reading at {path}:3 (--limit 2 " \
           "first turns kept): no later row could be kept; the rows after it are neither counted " \
           "nor checked" in printed
    imported = read_metadata(out)["imported"]
    assert (imported["read"], imported["dropped"]) == (2, {})
    assert imported["stopped"].startswith(f"stopped reading at {path}:3 (--limit 2 first")
    assert main(["workload", "import", str(path), "--format", "azure", "--out", str(out),
                 "--end", "4"]) == 0
    assert f"stopped reading at {path}:6 (it arrives at 4 s of the trace, at or after --end 4" \
        in capsys.readouterr().out
    assert main(["workload", "import", str(path), "--format", "azure", "--out", str(out),
                 "--end", "9"]) == 0
    assert "stopped" not in capsys.readouterr().out
    assert "stopped" not in read_metadata(out)["imported"]


def test_rows_read_are_still_held_to_time_order(tmp_path: Path) -> None:
    """A row out of time order before the stop is the error it always was."""
    path = azure(tmp_path, [GOOD[0], GOOD[2], GOOD[1], *GOOD[3:]])
    for options in ({"limit": 3}, {"end_s": 4.0}):
        with pytest.raises(WorkloadFormatError, match=rf"{path}:4: arrives 1 s before the row "
                           r"above it .*must be in time order \(sort it first\)"):
            run(path, **options)  # type: ignore[arg-type]


def test_the_first_malformed_row_in_file_order_is_the_error(tmp_path: Path) -> None:
    """A chunk's rows before its first malformed one are given first, so of two malformed rows
    the first in the file is the error (before: a later bad time beat an earlier bad count of
    the same 100,000-row chunk), as is a row out of order before a malformed one; a first row
    of no known time unit is still the error, not read with a unit guessed by the search for
    the first bad row."""
    path = azure(tmp_path, [GOOD[0], "2024-05-10 00:00:01.5,100,x", GOOD[2], "noon,100,10"])
    with pytest.raises(WorkloadFormatError, match=rf"{path}:3: column 'GeneratedTokens'"):
        run(path)
    path = azure(tmp_path, [GOOD[0], GOOD[2], GOOD[1], "noon,100,10"], "order.csv")
    with pytest.raises(WorkloadFormatError, match=rf"{path}:4: arrives 1 s before"):
        run(path)
    path = azure(tmp_path, ["5,100,10", "1715299200,100,10", "1715299201,100,10"], "unit.csv")
    with pytest.raises(WorkloadFormatError, match=rf"{path}:2: column 'TIMESTAMP': expected a "
                       "date and time or epoch seconds"):
        run(path, limit=1)


def test_an_import_that_keeps_nothing_reads_to_the_end(tmp_path: Path) -> None:
    """Reading stops only once a request is kept: a window that keeps none reads on, for the
    error naming the whole trace's span (or the malformed row it meets), as before."""
    path = azure(tmp_path, GOOD)
    with pytest.raises(WorkloadFormatError, match=r"keeps none of its requests \(read 6, kept 0"
                       r".*arrive from 0 to 5 s, the window is \[2.6, 2.9\) s"):
        run(path, start_s=2.6, end_s=2.9)
    path = azure(tmp_path, [*GOOD, MALFORMED["count"]], "bad.csv")
    with pytest.raises(WorkloadFormatError, match=rf"{path}:8: column 'ContextTokens'"):
        run(path, start_s=2.6, end_s=2.9)


def test_sharegpt_stops_after_a_whole_conversation(tmp_path: Path) -> None:
    """ShareGPT stops after the conversation that reaches the limit, its later turns kept;
    a malformed entry after it is never read (before: the whole import failed on it)."""
    path = tmp_path / "sg.jsonl"
    chat = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there"},
            {"from": "human", "value": "Bye"}, {"from": "gpt", "value": "Goodbye"}]
    path.write_text("".join(json.dumps(e) + "\n" for e in [
        {"id": "a", "conversations": chat}, {"id": "b", "conversations": chat[:2]},
        {"id": "c", "conversations": [{"from": "alien", "value": "?"}]}]))
    with pytest.raises(WorkloadFormatError, match=rf"{path}:3: .*unknown role 'alien'"):
        run(path, "sharegpt")
    requests, counts = run(path, "sharegpt", limit=1)
    assert [(r.conversation_id, r.turn) for r in requests] == [("a#0", 0), ("a#0", 1)]
    assert counts.read == 2 and counts.stopped is not None
    assert counts.stopped.startswith(f"stopped reading at {path}:1 (--limit 1 first turns")


def test_a_workload_file_reads_on_while_a_kept_conversation_may_continue(tmp_path: Path
                                                                        ) -> None:
    """A workload file's conversations may interleave (a later turn anywhere after its first),
    so ``--limit`` stops it only where no kept request belongs to a conversation; its arrivals
    need not be in time order, so ``--end`` never stops it."""
    def request(arrival: float, conversation: str | None = None, turn: int = 0) -> Request:
        return Request([1, 2, 3], 4, arrival_s=arrival, conversation_id=conversation, turn=turn)

    chats = tmp_path / "chats.jsonl"
    written([request(0.0, "a"), request(1.0, "b"), request(0.0, "a", 1), request(9.0),
             request(0.0, "b", 1)], chats)
    chats.write_bytes(chats.read_bytes() + b"{not json\n")
    with pytest.raises(WorkloadFormatError, match=rf"{chats}:7: not JSON"):
        run(chats, "replayllm", limit=1)
    singles = tmp_path / "singles.jsonl"
    written([request(5.0), request(1.0), request(7.0)], singles)
    singles.write_bytes(singles.read_bytes() + b"{not json\n")
    with pytest.raises(WorkloadFormatError, match=rf"{singles}:5: not JSON"):
        run(singles, "replayllm", end_s=6.0)
    requests, counts = run(singles, "replayllm", limit=2)
    assert [r.arrival_s for r in requests] == [5.0, 1.0] and counts.read == 2
    assert counts.stopped == (f"stopped reading at request 2 of {singles} (--limit 2 first "
                              "turns kept): no later row could be kept; the rows after it are "
                              "neither counted nor checked")
