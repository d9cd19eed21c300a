"""CSV traces with quoting the importers were not tuned to (session 33, docs/TESTING.md): a
quote left open, and records whose quoted fields hold line ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.workloads.fields import WorkloadFormatError
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens,Note\n"


def run(path: Path, fmt: str = "azure") -> list[tuple[object, ...]]:
    counts = ImportCounts()
    return [(r.prompt_len, r.max_tokens, r.arrival_s)
            for r in import_workload(path, fmt, ImportOptions(), counts)]


@pytest.mark.parametrize("fmt, text", [
    ("azure", HEADER + '2023-11-16 18:17:03.9799600,4808,10,"a, b\n'
     "2023-11-16 18:17:04.0319600,8,1,x\n2023-11-16 18:17:05.0319600,9,2,y\n"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
     '5,ChatGPT,472,18,490,"Conversation log\n6,ChatGPT,10,5,15,API log\n'
     "7,GPT-4,11,6,17,API log\n"),
])
def test_a_quote_left_open_is_one_line_not_rows_lost(tmp_path: Path, fmt: str,
                                                     text: str) -> None:
    """A quote opened and never closed made the rest of the file one field of the record it
    opened in: 3 rows read as 1, exit 0 (``read 1, kept 1``), the others lost in silence. It
    is now one line naming the record's first line and the line the file ends on."""
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(WorkloadFormatError, match=r"t.csv:2: malformed CSV \(unexpected end of "
                       r"data\); the record starting here runs to line 4: a quote opened and "
                       r"never closed\?$"):
        run(path, fmt)


def test_a_record_with_line_ends_in_quotes_is_named_by_its_first_line(tmp_path: Path) -> None:
    """A record whose quoted field holds line ends reads whole, and an error in it names the
    line it starts on (before: the line it ends on, where the named cell is not)."""
    good = tmp_path / "good.csv"
    good.write_text(HEADER + '2023-11-16 18:17:03.9799600,4808,10,"a, b\nc"\n'
                    "2023-11-16 18:17:04.0319600,8,1,x\n")
    assert run(good) == [(4808, 10, 0.0), (8, 1, 0.052)]
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "2023-11-16 18:17:03.9799600,4808,10,x\n"
                   '2023-11-16 18:17:04.0319600,lots,1,"one\ntwo\nthree"\n')
    with pytest.raises(WorkloadFormatError, match=r"bad.csv:3: column 'ContextTokens': "
                       r"expected a non-negative integer, got 'lots'$"):
        run(bad)
    short = tmp_path / "short.csv"
    short.write_text(HEADER + '2023-11-16 18:17:03.9799600,4808,"one\ntwo"\n')
    with pytest.raises(WorkloadFormatError, match=r"short.csv:2: 3 fields, the header has 4"):
        run(short)
