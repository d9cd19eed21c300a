"""Importers on realistic variations of the documented formats (read alike) and on malformed
input (one clear error naming file and line, never a traceback nor a silently wrong workload)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from engine.errors import InvalidRequestError
from replay.workloads.fields import MAX_TOKENS_LIMIT, WorkloadFormatError
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload
from replay.workloads.store import WorkloadWriter, read_workload

ROWS = [("2023-11-16 18:17:03.5", 100, 5), ("2023-11-16 18:17:04", 200, 0),
        ("2023-11-16 18:17:04", 300, 7)]  # a duplicate time, and an output of 0 (raised to 1)
EXPECTED = [(0.0, 100, 5), (0.5, 200, 1), (0.5, 300, 7)]


def run(path: Path, fmt: str, **options: object) -> tuple[list, ImportCounts]:
    counts = ImportCounts()
    requests = list(import_workload(path, fmt, ImportOptions(**options), counts))  # type: ignore
    return requests, counts


def summary(requests: list) -> list[tuple[float, int, int]]:
    return [(r.arrival_s, len(r.prompt), r.max_tokens) for r in requests]


def azure_text(header: str = "TIMESTAMP,ContextTokens,GeneratedTokens", end: str = "\n",
               rows: list[tuple[object, ...]] = ROWS) -> str:
    return end.join([header] + [",".join(map(str, row)) for row in rows]) + end


@pytest.mark.parametrize("variant", ["bom-crlf", "quoted", "reordered-extra", "header-case",
                                     "blank-lines", "gzip", "gzip-no-suffix"])
def test_csv_variants_read_as_the_plain_file(tmp_path: Path, variant: str) -> None:
    """A UTF-8 BOM with CRLF lines, quoted fields, other columns in another order, header names
    in another case or spacing, blank lines and gzip (by suffix or by content) all read as the
    plain file (before: the BOM, the header case and gzip were errors)."""
    path = tmp_path / "trace.csv"
    if variant == "bom-crlf":
        path.write_bytes(b"\xef\xbb\xbf" + azure_text(end="\r\n").encode())
    elif variant == "quoted":
        path.write_text(azure_text('"TIMESTAMP","ContextTokens","GeneratedTokens"',
                                   rows=[(f'"{t}"', f'"{p}"', o) for t, p, o in ROWS]))
    elif variant == "reordered-extra":
        path.write_text(azure_text("GeneratedTokens,Model,ContextTokens,TIMESTAMP",
                                   rows=[(o, '"gpt, 4"', p, t) for t, p, o in ROWS]))
    elif variant == "header-case":
        path.write_text(azure_text(" timestamp ,Context  Tokens,generatedtokens"))
    elif variant == "blank-lines":
        path.write_text("\n" + azure_text().replace("5\n", "5\n\n") + "\n\n")
    else:
        path = path.with_name("trace.csv.gz" if variant == "gzip" else "trace.csv")
        path.write_bytes(gzip.compress(azure_text().encode()))
    requests, counts = run(path, "azure")
    assert summary(requests) == EXPECTED
    assert counts.changed == {"output length 0 raised to 1": 1}


@pytest.mark.parametrize("row,message", [
    ("2023-11-16 18:17:05,10,5,7", r"trace.csv:5: 4 fields, the header has 3"),
    ("2023-11-16 18:17:05,10", r"trace.csv:5: 2 fields, the header has 3"),
    ("2023-11-16 18:17:05,99999999999999999999,5",
     r"trace.csv:5: column 'ContextTokens': expected a non-negative integer <= 2147483647"),
    ("2023-11-16 18:17:05,NaN,5", r"trace.csv:5: column 'ContextTokens': expected a non-neg"),
    ("2023-11-16 18:17:05,10,-1", r"trace.csv:5: column 'GeneratedTokens': expected a non-neg"),
    ("9999-12-31 00:00:00,10,5", r"trace.csv:5: column 'TIMESTAMP': expected an ISO 8601 date"),
    ("2023-11-16 18:17:03,10,5", r"trace.csv:5: arrives 1 s before the row above it "
                                 r"\(.*trace.csv:4\): a trace's rows must be in time order"),
])
def test_malformed_csv_rows_are_one_line_errors(tmp_path: Path, row: str, message: str) -> None:
    """A row with more or fewer fields than the header (before: the extra field was silently
    dropped, so an unquoted comma shifted nothing visible), a huge count (before: a traceback
    from a negative length), NaN or negative counts, a date pandas cannot hold (before: wrapped
    around silently) and a row earlier than the row above it (before: accepted unless earlier
    than the first row) each raise one error naming the file, the line and the column."""
    path = tmp_path / "trace.csv"
    path.write_text(azure_text() + row + "\n")
    with pytest.raises(WorkloadFormatError, match=message):
        run(path, "azure")


def test_azure_times_as_epoch_numbers_or_zoned_dates(tmp_path: Path) -> None:
    """TIMESTAMP as epoch seconds or milliseconds (the unit told by magnitude) reads as the
    date-times do (before: an error); a file mixing zoned and naive times, or a number of no
    epoch unit, is an error (the arrivals would be wrong by the unknown zone or unit)."""
    epochs = {"s": [1700158623.5, 1700158624, 1700158624],
              "ms": [1700158623500, 1700158624000, 1700158624000]}
    for unit, stamps in epochs.items():
        path = tmp_path / f"{unit}.csv"
        path.write_text(azure_text(rows=[(s, p, o) for s, (_, p, o) in zip(stamps, ROWS)]))
        assert summary(run(path, "azure")[0]) == EXPECTED
    mixed = tmp_path / "mixed.csv"
    mixed.write_text(azure_text(rows=[("2023-11-16T18:17:03+00:00", 1, 1),
                                      ("2023-11-16T18:17:04", 1, 1)]))
    with pytest.raises(WorkloadFormatError, match=r"mixed.csv:3: column 'TIMESTAMP': expected "
                       r"a date and time with a zone, as line 2"):
        run(mixed, "azure")
    relative = tmp_path / "relative.csv"
    relative.write_text(azure_text(rows=[(12, 1, 1)]))
    with pytest.raises(WorkloadFormatError, match=r"relative.csv:2: column 'TIMESTAMP': "
                       r"expected a date and time or epoch seconds"):
        run(relative, "azure")


def test_arrivals_count_from_the_first_row_in_every_trace_format(tmp_path: Path) -> None:
    """A Mooncake file of epoch-millisecond timestamps and a BurstGPT file starting at 5 s both
    start at 0 (before: the Mooncake workload waited 54 years for its first request), and a
    Mooncake line earlier than the line above it is an error (before: kept out of order)."""
    lines = [{"timestamp": 1700000000000 + ms, "input_length": 10, "output_length": 2,
              "hash_ids": [1]} for ms in (0, 1500, 1500)]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [r.arrival_s for r in run(path, "mooncake")[0]] == [0.0, 1.5, 1.5]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines[::-1]))
    with pytest.raises(WorkloadFormatError, match=r"m.jsonl:3: arrives 1.5 s before the row "
                       r"above it \(.*m.jsonl:2\)"):
        run(path, "mooncake")
    burst = tmp_path / "b.csv"
    burst.write_text("Timestamp,Request tokens,Response tokens\n5,10,1\n7.5,20,2\n")
    assert summary(run(burst, "burstgpt")[0]) == [(0.0, 10, 1), (2.5, 20, 2)]


def test_mooncake_json_array_gzip_bom_and_missing_or_null_hash_ids(tmp_path: Path) -> None:
    """A JSON array instead of JSON Lines, a gzip file and a BOM with CRLF lines read as plain
    JSONL (before: errors), and ``hash_ids`` empty, missing or null all mean no named block
    (before: null was an error, unlike the workload format where null is absent)."""
    records = [{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [7, 8]},
               {"timestamp": 10, "input_length": 30, "output_length": 2, "hash_ids": []},
               {"timestamp": 20, "input_length": 30, "output_length": 2},
               {"timestamp": 30, "input_length": 30, "output_length": 2, "hash_ids": None}]
    jsonl = "".join(json.dumps(r) + "\n" for r in records)
    plain = tmp_path / "plain.jsonl"
    plain.write_text(jsonl)
    expected = [(r.arrival_s, r.prompt) for r in run(plain, "mooncake")[0]]
    assert [p.hash_ids for _, p in expected] == [(7, 8), (), (), ()]
    variants = {"array.json": json.dumps(records, indent=1).encode(),
                "bom.jsonl": b"\xef\xbb\xbf" + jsonl.replace("\n", "\r\n").encode(),
                "plain.jsonl.gz": gzip.compress(jsonl.encode())}
    for name, data in variants.items():
        (tmp_path / name).write_bytes(data)
        assert [(r.arrival_s, r.prompt) for r in run(tmp_path / name, "mooncake")[0]] == expected
    bad = tmp_path / "bad.jsonl"
    bad.write_text(jsonl + "{oops\n" + jsonl)
    with pytest.raises(WorkloadFormatError, match=r"bad.jsonl:5: not JSON"):
        run(bad, "mooncake")


def test_prompts_over_the_format_limit_are_dropped_or_clipped_and_counted(tmp_path: Path) -> None:
    """A trace prompt over the workload format's 2^20 tokens is dropped (or clipped with
    --over-length clip), counted, and the written file reads back (before: the CSV importer
    wrote a prompt_len of 2,000,000 that no reader accepts, and Mooncake refused the file)."""
    csv_path = tmp_path / "a.csv"
    csv_path.write_text(azure_text(rows=[("2023-11-16 18:17:03", 2_000_000, 3),
                                         ("2023-11-16 18:17:04", 10, 3)]))
    moon = tmp_path / "m.jsonl"
    moon.write_text('{"timestamp": 0, "input_length": 2000000, "output_length": 3}\n'
                    '{"timestamp": 1, "input_length": 10, "output_length": 3}\n')
    for path, fmt in ((csv_path, "azure"), (moon, "mooncake")):
        requests, counts = run(path, fmt)
        assert [len(r.prompt) for r in requests] == [10]
        assert counts.dropped == {f"prompt over {MAX_TOKENS_LIMIT} tokens": 1}
        requests, counts = run(path, fmt, over_length="clip")
        assert [len(r.prompt) for r in requests] == [MAX_TOKENS_LIMIT, 10]
        out = tmp_path / f"{fmt}.jsonl"
        writer = WorkloadWriter(out)
        writer.write_all(requests)
        writer.close()
        assert [len(r.prompt) for r in read_workload(out)] == [MAX_TOKENS_LIMIT, 10]


def test_sources_or_windows_that_keep_nothing_are_errors(tmp_path: Path) -> None:
    """An empty file, a header-only CSV, a blank JSONL and a window past the trace's end raise
    an error saying so, with the trace's span for a window (before: a 0-request workload was
    written and the command exited 0)."""
    header = tmp_path / "header.csv"
    header.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n\r\n")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(WorkloadFormatError, match=r"header.csv: holds no requests"):
        run(header, "azure")
    with pytest.raises(WorkloadFormatError, match=r"blank.jsonl: holds no requests"):
        run(blank, "mooncake")
    with pytest.raises(WorkloadFormatError, match=r"empty.csv: empty file: not a BurstGPT CSV"):
        run(empty, "burstgpt")
    trace = tmp_path / "t.csv"
    trace.write_text(azure_text())
    with pytest.raises(WorkloadFormatError, match=r"t.csv: the import keeps none of its requests "
                       r"\(read 3, kept 0, dropped 3 \(outside the time window\)\); its first "
                       r"turns arrive from 0 to 0.5 s, the window is \[10, inf\) s"):
        run(trace, "azure", start_s=10)


def test_options_that_would_write_an_unreadable_file_are_rejected(tmp_path: Path) -> None:
    """A temperature of NaN or below 0, a ShareGPT rate of 0 (before: ZeroDivisionError) and a
    time scale that overflows an arrival to infinity are option errors (before: each wrote a
    workload its own reader refuses)."""
    for bad in (float("nan"), -1.0):
        with pytest.raises(InvalidRequestError, match="--temperature must be a finite number"):
            ImportOptions(temperature=bad)
    with pytest.raises(InvalidRequestError, match="--rate must be finite and > 0"):
        ImportOptions(rate=0.0)
    trace = tmp_path / "t.csv"
    trace.write_text(azure_text(rows=ROWS + [("2023-11-16 18:17:13", 1, 1)]))
    # The first arrival past a week (run's rule, fields.check_request) is refused: here the
    # second row's 5e307 s, before the last row's overflow to infinity.
    with pytest.raises(InvalidRequestError, match=r"--time-scale 1e\+308 puts the request at "
                       r"0.5 s of the trace at 5e\+307 s: arrival_s must be a finite number"):
        run(trace, "azure", time_scale=1e308)


def test_a_failed_import_is_one_line_exit_2_and_leaves_no_partial_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the CLI, a malformed trace gives exit code 2, one error line and no traceback,
    and removes the PATH.partial it had started (before: left behind)."""
    from replay.cli.main import main

    trace = tmp_path / "t.csv"
    trace.write_text(azure_text() + "2023-11-16 18:17:05,10,5,7\n")
    out = tmp_path / "w.jsonl"
    assert main(["workload", "import", str(trace), "--format", "azure", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("replayllm workload: error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_the_same_import_twice_gives_the_same_workload(tmp_path: Path) -> None:
    """Importing the same trace with the same options twice gives identical requests (salts,
    arrivals, lengths), and another --seed other salts."""
    trace = tmp_path / "t.csv.gz"
    trace.write_bytes(gzip.compress(azure_text().encode()))
    first, second = run(trace, "azure", seed=3)[0], run(trace, "azure", seed=3)[0]
    assert first == second
    assert [r.prompt.salt for r in run(trace, "azure", seed=4)[0]] != \
        [r.prompt.salt for r in first]


@pytest.mark.parametrize("fmt, text", [
    ("mooncake", '{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 1}\n'),
    ("sharegpt", '[{"id": "x", "n": ' + "9" * 5000 + ', "conversations": []}]'),
])
def test_an_integer_too_long_to_parse_is_one_line(tmp_path: Path, fmt: str, text: str) -> None:
    """An integer of over 4,300 digits in a JSON trace was a ValueError traceback (Python's
    limit on converting a string to int); now one line naming the file."""
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(WorkloadFormatError, match="t.json.*not JSON .a number too long to read"):
        run(path, fmt)
