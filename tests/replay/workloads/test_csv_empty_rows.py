"""CSV rows of empty fields only (``,,``), as a spreadsheet saves its empty rows, are skipped as
blank lines are: an Azure or BurstGPT trace saved from a spreadsheet was refused at its first
such row (``column 'TIMESTAMP': expected an ISO 8601 date and time, got ''``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.workloads.fields import WorkloadFormatError
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
         "2023-11-16 18:17:03.9799600,4808,10\r\n"
         "2023-11-16 18:17:04.0319600,3180,8\r\n")


def _import(path: Path, fmt: str = "azure") -> tuple[list[tuple[float, int, int]],
                                                     ImportCounts]:
    counts = ImportCounts()
    requests = [(r.arrival_s, len(r.prompt), r.max_tokens)  # type: ignore[arg-type]
                for r in import_workload(path, fmt, ImportOptions(), counts)]
    return requests, counts


@pytest.mark.parametrize("empty", [",,\r\n", '"","",""\r\n', " , ,\r\n", ",,\r\n,,\r\n\r\n"])
def test_rows_of_empty_fields_read_as_blank_lines(tmp_path: Path, empty: str) -> None:
    """Empty rows after the data, between rows and before the header give the rows and counts
    of the file without them."""
    plain = tmp_path / "plain.csv"
    plain.write_text(AZURE)
    expected = _import(plain)
    header, first, second = AZURE.splitlines(keepends=True)
    for text in (AZURE + empty, header + first + empty + second, empty + AZURE):
        saved = tmp_path / "saved.csv"
        saved.write_text(text)
        requests, counts = _import(saved)
        assert requests == expected[0]
        assert counts.to_dict() == expected[1].to_dict()


def test_a_row_with_one_value_is_still_an_error(tmp_path: Path) -> None:
    """Only rows holding nothing are skipped: a row with a value left is malformed, named."""
    path = tmp_path / "t.csv"
    path.write_text(AZURE + ",5,\r\n")
    with pytest.raises(WorkloadFormatError, match=r"t.csv:4: column 'TIMESTAMP'"):
        _import(path)
