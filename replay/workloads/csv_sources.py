"""Public CSV traces as workload requests: Azure LLM inference 2023/2024 and BurstGPT v1/v1.2.

Columns are found by name (case, and spaces around and inside a name, ignored; other columns,
in any order, are ignored); the file may be gzip-compressed, start with a byte-order mark, end
lines with CRLF and hold blank lines or rows of empty fields (``,,``), which are skipped
(``replay.workloads.text_input``). Rows stream in chunks, so a 27-million-row file fits in
bounded memory. Every row must have as many fields as
the header: a row with more or fewer (an unquoted comma, a cut line) would put values under the
wrong column. Quoting is RFC 4180's (``csv`` strict): a quoted field may hold commas and line
ends, and a row is named by the line it starts on; a quote never closed is an error, not a last
field holding every row after it. A malformed row is an error once the reader reaches it, the
rows before it given first: an import that stops reading earlier (``--limit``, ``--end``) never
meets it, and reads little past its stop (the first chunks are small: ``FIRST_CHUNK_ROWS``).
Prompts are recipes of the trace's lengths with tokens unique to each request (the traces
carry no text and no prefix structure). Each source yields ``(where, arrival seconds after the
first row, prompt tokens, output tokens)``; ``replay.workloads.imports`` turns them into
requests. A malformed cell raises ``WorkloadFormatError`` naming file, line and column.

Times (``TIMESTAMP`` of Azure, ``Timestamp`` of BurstGPT): ISO 8601 date-times, all with a
time zone (converted to UTC) or all without one (a file mixing both is an error: the zone of the
others is unknown). A number in a BurstGPT file is seconds; in an Azure file, epoch seconds,
milliseconds, microseconds or nanoseconds, the unit told by the first row's magnitude (a number
in none of those ranges, or of another unit than the first row's, is an error).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from replay.workloads.fields import WorkloadFormatError
from replay.workloads.formats import NEEDS, key, names_in, not_format
from replay.workloads.import_options import COUNT_LIMIT
from replay.workloads.text_input import TEXT_ERRORS, open_text, read_error

CHUNK_ROWS = 100_000
FIRST_CHUNK_ROWS = 1024  # then twice as many a chunk, up to CHUNK_ROWS
KINDS = {"azure": "an Azure LLM inference CSV", "burstgpt": "a BurstGPT CSV"}
# (file:line, arrival_s, prompt tokens, output tokens, BurstGPT's Model when asked for)
Row = tuple[str, float, int, int, str | None]
MODEL = "Model"  # BurstGPT's column of the model served (ChatGPT, GPT-4): --filter-model
# Epoch units by magnitude (2001 to 2255 in each): (low, high, nanoseconds per unit, name).
EPOCH_UNITS = ((1e9, 9e9, 10**9, "seconds"), (1e12, 9e12, 10**6, "milliseconds"),
               (1e15, 9e15, 10**3, "microseconds"), (1e18, 9e18, 1, "nanoseconds"))
ZONE = r"\d:\d\d(?::\d\d(?:[.,]\d*)?)?\s*(?:[zZ]|[+-]\d\d(?::?\d\d)?)\s*$"
# A number written as digits with a decimal point (no exponent): its digits read exactly.
DECIMAL = r"^\s*\+?(\d+)\.(\d*)\s*$"
SECONDS_LIMIT = 9e9  # a seconds column: at most this (its nanoseconds fit an int64)


def _blank(row: list[str]) -> bool:
    """A row that holds nothing, skipped: a blank line, or empty fields only (``,,``: how a
    spreadsheet saves its empty rows, often after the data)."""
    return all(not cell.strip() for cell in row)


def _columns(where: str, header: list[str], fmt: str, extra: tuple[str, ...]) -> list[int]:
    keys = [key(name) for name in header]
    index = []
    for column in NEEDS[fmt][1] + extra:
        found = [i for i, k in enumerate(keys) if k == key(column)]
        if not found:  # names what the file holds (a JSON line's fields), and the formats read
            found = names_in(",".join(header))
            problem = "a JSON line, not a CSV header" if found[0] == "fields" else \
                f"no column {column!r}" + (" (--filter-model reads it)" if column == MODEL
                                           else "")
            raise not_format(f"{where}: not {KINDS[fmt]}: {problem}", fmt, found)
        if len(found) > 1:
            raise WorkloadFormatError(f"{where}: column {column!r} appears {len(found)} times")
        index.append(found[0])
    return index


def _chunks(path: str | Path, fmt: str, extra: tuple[str, ...] = ()
            ) -> Iterator[tuple[list[int], list[Any]]]:
    """(line numbers, one pandas Series of strings per needed column, then per ``extra``
    column) per chunk of rows; a row that is no CSV record of the header's fields, or text
    that cannot be read, is an error raised after the rows before it are yielded."""
    import pandas as pd

    needed = NEEDS[fmt][1] + extra
    lines: list[int] = []
    cells: list[list[str]] = [[] for _ in needed]
    error: WorkloadFormatError | None = None
    handle = open_text(path, newline="")
    with handle:
        # strict: a quote left open is an error at the end of the file, never one last field
        # holding every row after it (the rows lost in silence)
        reader = csv.reader(handle, strict=True)
        start = 1  # the line a record starts on (a quoted field may hold line ends)
        size = FIRST_CHUNK_ROWS
        try:
            header = next(reader, None)
            while header is not None and _blank(header):
                start, header = reader.line_num + 1, next(reader, None)
            if header is None:
                raise WorkloadFormatError(f"{path}: empty file: not {KINDS[fmt]} (no header)")
            index = _columns(f"{path}:{start}", header, fmt, extra)
            start = reader.line_num + 1
            for row in reader:
                row_start, start = start, reader.line_num + 1
                if _blank(row):
                    continue
                if len(row) != len(header):
                    error = WorkloadFormatError(
                        f"{path}:{row_start}: {len(row)} fields, the header has "
                        f"{len(header)} (an unquoted comma or a cut line?)")
                    break
                lines.append(row_start)
                for column, i in zip(cells, index):
                    column.append(row[i])
                if len(lines) >= size:
                    yield lines, [pd.Series(c, dtype=object) for c in cells]
                    lines, cells = [], [[] for _ in needed]
                    size = min(2 * size, CHUNK_ROWS)
        except csv.Error as exc:
            runs = (f"; the record starting here runs to line {reader.line_num}: a quote "
                    "opened and never closed?" if reader.line_num > start else "")
            error = WorkloadFormatError(f"{path}:{start}: malformed CSV ({exc}){runs}")
        except TEXT_ERRORS as exc:
            error = read_error(path, exc)
        if lines:
            yield lines, [pd.Series(c, dtype=object) for c in cells]
    if error is not None:
        raise error from None


def _bad(path: str | Path, lines: list[int], mask: np.ndarray, values: Any, column: str,
         expected: str) -> WorkloadFormatError:
    where = int(np.flatnonzero(mask)[0])
    return WorkloadFormatError(f"{path}:{lines[where]}: column {column!r}: expected "
                               f"{expected}, got {values.iloc[where]!r}")


def _counts(path: str | Path, lines: list[int], values: Any, column: str) -> np.ndarray:
    import pandas as pd

    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(numbers) | (numbers < 0) | (numbers != np.floor(numbers))
    if bad.any():
        raise _bad(path, lines, bad, values, column, "a non-negative integer")
    huge = numbers > COUNT_LIMIT
    if huge.any():
        raise _bad(path, lines, huge, values, column, f"a non-negative integer <= {COUNT_LIMIT}")
    return numbers.astype(np.int64)


class _Clock:
    """One file's time column as nanoseconds: its form (numbers, or date-times with or
    without a zone) and, for Azure epoch numbers, its unit, are the first row's."""

    def __init__(self, path: str | Path, column: str, epoch: bool) -> None:
        self.path, self.column, self.epoch = path, column, epoch
        self.form: str | None = None  # "number", "zoned" or "naive"
        self.unit: tuple[float, float, int, str] = (0.0, SECONDS_LIMIT, 10**9, "seconds")
        self.first_line = 0
        self.base = 0.0  # the first time's whole part, in the file's unit: ``_exact``

    def _expected(self) -> str:
        if self.form == "number":
            what = f"epoch {self.unit[3]}" if self.epoch else "seconds (a number >= 0)"
        else:
            what = f"a date and time {'with' if self.form == 'zoned' else 'without'} a zone"
        return f"{what}, as line {self.first_line}"

    def nanoseconds(self, lines: list[int], values: Any) -> np.ndarray:
        """The times of a chunk's rows as nanoseconds; a chunk it refuses decides nothing (the
        first chunk read sets the form and unit)."""
        decided = (self.form, self.unit, self.first_line, self.base)
        try:
            return self._nanoseconds(lines, values)
        except WorkloadFormatError:
            self.form, self.unit, self.first_line, self.base = decided
            raise

    def _nanoseconds(self, lines: list[int], values: Any) -> np.ndarray:
        import pandas as pd

        parsed_numbers = pd.to_numeric(values, errors="coerce")
        numbers = parsed_numbers.to_numpy(dtype=float)
        numeric = ~np.isnan(numbers)
        zoned = values.str.contains(ZONE, regex=True).to_numpy(dtype=bool)
        forms = np.where(numeric, "number", np.where(zoned, "zoned", "naive"))
        if self.form is None:
            self.form, self.first_line = str(forms[0]), lines[0]
            self.base = float(np.floor(numbers[0])) if numeric[0] else 0.0
            if self.form == "number" and self.epoch:
                units = [u for u in EPOCH_UNITS if u[0] <= numbers[0] < u[1]]
                if not units:
                    raise _bad(self.path, lines, numeric, values, self.column, "a date and "
                               "time or epoch seconds, milliseconds, microseconds or "
                               "nanoseconds (years 2001 to 2255)")
                self.unit = units[0]
        mismatch = forms != self.form
        if mismatch.any():
            raise _bad(self.path, lines, mismatch, values, self.column, self._expected())
        if self.form == "number":
            low, high, scale, _ = self.unit
            bad = ~((numbers >= low) & (numbers < high))
            if bad.any():
                raise _bad(self.path, lines, bad, values, self.column, self._expected())
            return _exact(values, parsed_numbers, numbers, scale, self.base)
        parsed = pd.to_datetime(values, format="ISO8601", utc=True, errors="coerce")
        bad = (parsed.isna() | (parsed < pd.Timestamp("1970-01-01", tz="UTC"))
               | (parsed >= pd.Timestamp("2262-01-01", tz="UTC"))).to_numpy(dtype=bool)
        if bad.any():
            raise _bad(self.path, lines, bad, values, self.column, "an ISO 8601 date and time "
                       "(years 1970 to 2261)")
        return parsed.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]").astype(np.int64)


def _exact(values: Any, parsed: Any, numbers: np.ndarray, scale: int, base: float
           ) -> np.ndarray:
    """Times in units of ``1 / scale`` ns as integer nanoseconds, exact to the nanosecond:
    integers (epoch milliseconds) in integer arithmetic; decimals (``1715299200.123``) from
    their digits where the float is not exact to a nanosecond (past 2**53 ns: near 1.7e9 s
    floats are 238 ns apart, and 0.377 s came out 0.377000093), else as their distance from
    ``base`` (the file's first time's whole part) before scaling. Scaled whole, an epoch time of
    1.7e18 ns is a float 256 ns apart from the next: 1715299201250 ms less 1715299200500 ms
    read as 0.749999872 s."""
    if parsed.dtype.kind in "iu":
        return parsed.to_numpy(dtype=np.int64) * scale
    ns = int(base) * scale + np.rint((numbers - base) * scale).astype(np.int64)
    if np.nanmax(np.abs(numbers)) * scale < 2.0**53:
        return ns  # every float here is exact to the nanosecond
    digits = len(str(scale)) - 1  # of a unit's fraction that are whole nanoseconds
    parts = values.str.extract(DECIMAL)
    plain = parts[0].notna().to_numpy()
    if plain.any():  # "1.7e9" and the like keep the float's reading
        whole = parts[0][plain].astype(np.int64).to_numpy()
        fraction = parts[1][plain].str.ljust(digits, "0").str[:digits] if digits else None
        ns[plain] = whole * scale + (0 if fraction is None
                                     else fraction.astype(np.int64).to_numpy())
    return ns


Parsed = tuple[np.ndarray, np.ndarray, np.ndarray]  # a chunk's nanoseconds, prompts, outputs


def _rows(path: str | Path, fmt: str, epoch: bool, model: bool = False) -> Iterator[Row]:
    """The rows of a CSV trace (``Row``), in file order; a malformed row raises once the rows
    before it are given."""
    time, prompt_column, output_column = NEEDS[fmt][1]
    clock = _Clock(path, time, epoch)

    def parse(lines: list[int], columns: list[Any]) -> Parsed:
        return (clock.nanoseconds(lines, columns[0]),
                _counts(path, lines, columns[1], prompt_column),
                _counts(path, lines, columns[2], output_column))

    origin: int | None = None
    for lines, columns in _chunks(path, fmt, (MODEL,) if model else ()):
        error: WorkloadFormatError | None = None
        try:
            ns, prompt, output = parse(lines, columns)
        except WorkloadFormatError as exc:  # the rows before the first malformed one first
            good, error = _first_bad(parse, lines, columns, exc)
            if not good:
                raise error from None
            lines, columns = lines[:good], [c.iloc[:good] for c in columns]
            ns, prompt, output = parse(lines, columns)
        if origin is None:
            origin = int(ns[0])
        seconds = (ns - origin) / 1e9  # exact to the nanosecond before the float division
        yield from zip((f"{path}:{line}" for line in lines), seconds.tolist(), prompt.tolist(),
                       output.tolist(), columns[3].tolist() if model else [None] * len(lines))
        if error is not None:
            raise error


def _first_bad(parse: Callable[[list[int], list[Any]], Parsed], lines: list[int],
               columns: list[Any], error: WorkloadFormatError) -> tuple[int, WorkloadFormatError]:
    """(index, error) of the first row of a chunk that ``parse`` refused (``error``), found by
    bisecting its leading rows: a row's checks do not depend on the rows after it."""
    good, bad = 0, len(lines)  # the first ``good`` rows parse, the first ``bad`` do not
    while bad - good > 1:
        middle = (good + bad) // 2
        try:
            parse(lines[:middle], [c.iloc[:middle] for c in columns])
            good = middle
        except WorkloadFormatError as exc:
            bad, error = middle, exc
    return good, error


def azure_rows(path: str | Path) -> Iterator[Row]:
    """Azure LLM inference 2023 or 2024 (``TIMESTAMP`` a date-time; an epoch number read too)."""
    return _rows(path, "azure", epoch=True)


def burstgpt_rows(path: str | Path, model: bool = False) -> Iterator[Row]:
    """BurstGPT v1 or v1.2 (``Timestamp`` is seconds from the trace start; a date-time too);
    with ``model``, each row's ``Model`` too (else None)."""
    return _rows(path, "burstgpt", epoch=False, model=model)
