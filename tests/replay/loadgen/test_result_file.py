"""``read_result`` (``whatif TRACE --compare RESULT``) refuses a loadgen result file it cannot
use: metadata that is not the object ``write_result`` writes, or per-request columns missing or
of the wrong type, are one ``ResultError`` naming the file and what is wrong (was: a TypeError,
or the file accepted and the command exiting 0). No server: the files are written here."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replay.loadgen.answer import Measured
from replay.loadgen.result import (
    METADATA_KEY,
    OPTIONAL_COLUMNS,
    REQUEST_COLUMNS,
    ResultError,
    read_result,
    requests_frame,
    summarize,
    write_result,
)


def _frame() -> pd.DataFrame:
    return requests_frame([Measured(i, 5, 3, 0.01 * i, 0.01 * i, 0.01 * i + 0.02,
                                    0.01 * i + 0.05, 3, 5, [0.01 * i + t for t in (0.02, 0.05)],
                                    "length") for i in range(3)])


def _write(path: Path, frame: pd.DataFrame, metadata: bytes) -> Path:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: metadata}), path)
    return path


def test_a_result_round_trips(tmp_path: Path) -> None:
    """What ``write_result`` writes reads back, with no requests too (its columns kept)."""
    frame = _frame()
    summary = summarize(frame, 1.0)
    back, read_summary, run = read_result(write_result(tmp_path / "r.parquet", frame, summary,
                                                       {"url": "u"}))
    assert len(back) == 3 and read_summary == pytest.approx(summary, nan_ok=True)
    assert run == {"url": "u"}
    empty = requests_frame([])
    assert list(empty.columns) == [*REQUEST_COLUMNS, *OPTIONAL_COLUMNS]
    back, _, _ = read_result(write_result(tmp_path / "e.parquet", empty, summarize(empty, 1.0),
                                          {}))
    assert len(back) == 0


@pytest.mark.parametrize("metadata", [b"[1, 2]", b'"x"', b'{"summary": [1], "run": {}}',
                                      b'{"summary": {"ttft_mean_s": "x"}, "run": {}}',
                                      b'{"summary": {}}'])
def test_malformed_metadata_is_a_result_error(tmp_path: Path, metadata: bytes) -> None:
    """Metadata that is a JSON list (was: TypeError), or a summary not of numbers, or no run."""
    path = _write(tmp_path / "r.parquet", _frame(), metadata)
    with pytest.raises(ResultError, match=f"{path}: malformed loadgen metadata"):
        read_result(path)


def test_missing_or_wrong_columns_are_a_result_error(tmp_path: Path) -> None:
    """A result without the per-request columns (was: accepted, whatif exiting 0) or with a
    latency column of text names the file and the columns."""
    meta = json.dumps({"summary": {}, "run": {}}).encode()
    path = _write(tmp_path / "cols.parquet", _frame()[["index", "error"]], meta)
    with pytest.raises(ResultError, match=r"cols.parquet: not a loadgen result: no arrival_s, "):
        read_result(path)
    path = _write(tmp_path / "text.parquet", _frame().assign(ttft_s="x"), meta)
    with pytest.raises(ResultError, match="text.parquet: loadgen result column ttft_s is not "
                                          "numeric"):
        read_result(path)
