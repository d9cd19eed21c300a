"""Public CSV traces as workload requests: Azure LLM inference 2023/2024 and BurstGPT v1/v1.2.

Columns are read by name (a file's other columns are ignored), in chunks, so a 27-million-row
file streams. Prompts are recipes of the trace's lengths with tokens unique to each request
(the traces carry no text and no prefix structure). Each source yields ``(row, arrival seconds
from the trace start, prompt tokens, output tokens)``; ``replay.workloads.imports`` turns them
into requests. A malformed cell raises ``WorkloadFormatError`` naming file, line and column.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from replay.workloads.fields import WorkloadFormatError

CHUNK_ROWS = 200_000
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
Row = tuple[int, float, int, int]  # (line, arrival_s, prompt tokens, output tokens)


def _header(path: str | Path, needed: tuple[str, ...], kind: str) -> None:
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            header = next(csv.reader(handle), [])
    except OSError as exc:
        raise WorkloadFormatError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise WorkloadFormatError(f"{path}: not UTF-8 text ({exc.reason})") from None
    missing = [c for c in needed if c not in header]
    if missing:
        raise WorkloadFormatError(f"{path}:1: not a {kind} CSV: no column {missing[0]!r} "
                                  f"(columns: {', '.join(header) or 'none'})")


def _chunks(path: str | Path, columns: tuple[str, ...]) -> Iterator[tuple[int, object]]:
    import pandas as pd

    first_line = 2  # line 1 is the header
    try:
        reader = pd.read_csv(path, usecols=list(columns), dtype=str, chunksize=CHUNK_ROWS,
                             keep_default_na=False)
        for chunk in reader:
            yield first_line, chunk
            first_line += len(chunk)
    except (ValueError, pd.errors.ParserError) as exc:
        message = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise WorkloadFormatError(f"{path}: malformed CSV ({message})") from None


def _bad(path: str | Path, first_line: int, mask: np.ndarray, values: object, column: str,
         expected: str) -> WorkloadFormatError:
    where = int(np.flatnonzero(mask)[0])
    value = values.iloc[where]  # type: ignore[attr-defined]
    return WorkloadFormatError(f"{path}:{first_line + where}: column {column!r}: expected "
                               f"{expected}, got {value!r}")


def _counts(path: str | Path, first_line: int, chunk: object, column: str) -> np.ndarray:
    import pandas as pd

    values = chunk[column]  # type: ignore[index]
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(numbers) | (numbers < 0) | (numbers != np.floor(numbers))
    if bad.any():
        raise _bad(path, first_line, bad, values, column, "a non-negative integer")
    return numbers.astype(np.int64)


def _seconds(path: str | Path, first_line: int, chunk: object, column: str) -> np.ndarray:
    import pandas as pd

    values = chunk[column]  # type: ignore[index]
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(numbers) | (numbers < 0)
    if bad.any():
        raise _bad(path, first_line, bad, values, column, "seconds (a number >= 0)")
    return numbers


def _timestamps(path: str | Path, first_line: int, chunk: object, column: str) -> np.ndarray:
    """Datetimes (2023: naive, 7 fractional digits; 2024: with a time zone) as UTC ns."""
    import pandas as pd

    values = chunk[column]  # type: ignore[index]
    parsed = pd.to_datetime(values, format="ISO8601", utc=True, errors="coerce")
    bad = parsed.isna().to_numpy()
    if bad.any():
        raise _bad(path, first_line, bad, values, column, "a date and time")
    return parsed.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]").astype(np.int64)


def azure_rows(path: str | Path) -> Iterator[Row]:
    """Azure LLM inference 2023 or 2024: arrivals are seconds after the first row's time."""
    _header(path, AZURE_COLUMNS, "Azure LLM inference")
    origin: int | None = None
    for first_line, chunk in _chunks(path, AZURE_COLUMNS):
        ns = _timestamps(path, first_line, chunk, "TIMESTAMP")
        prompt = _counts(path, first_line, chunk, "ContextTokens")
        output = _counts(path, first_line, chunk, "GeneratedTokens")
        if origin is None and len(ns):
            origin = int(ns[0])
        seconds = (ns - (origin or 0)) / 1e9
        yield from zip(range(first_line, first_line + len(ns)), seconds.tolist(),
                       prompt.tolist(), output.tolist())


def burstgpt_rows(path: str | Path) -> Iterator[Row]:
    """BurstGPT v1 or v1.2 (``Timestamp`` is seconds from the trace start)."""
    _header(path, BURSTGPT_COLUMNS, "BurstGPT")
    for first_line, chunk in _chunks(path, BURSTGPT_COLUMNS):
        seconds = _seconds(path, first_line, chunk, "Timestamp")
        prompt = _counts(path, first_line, chunk, "Request tokens")
        output = _counts(path, first_line, chunk, "Response tokens")
        yield from zip(range(first_line, first_line + len(seconds)), seconds.tolist(),
                       prompt.tolist(), output.tolist())
