"""Workload files on disk: JSONL (hand-written) and Parquet (large), read and written streaming.

``read_workload(path)`` yields one validated ``Request`` at a time (``replay.workloads.fields``);
``WorkloadWriter`` writes them one at a time (Parquet in row groups). A file's metadata (format
version, how it was made, what an import dropped) is the JSONL header line or the Parquet
key-value metadata under ``replayllm_workload``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from replay.workloads.fields import (
    FORMAT_NAME,
    FORMAT_VERSION,
    READABLE_VERSIONS,
    ConversationOrder,
    WorkloadFormatError,
    record_from_request,
    request_from_record,
)
from replay.workloads.formats import looks_like, names_in
from replay.workloads.request import Request
from replay.workloads.text_input import TEXT_ERRORS, loads, open_text, read_error
from tracing.outfile import write_via_temporary

PARQUET_SUFFIXES = (".parquet", ".pq")
ROW_GROUP = 65536


def is_parquet(path: str | Path) -> bool:
    return str(path).lower().endswith(PARQUET_SUFFIXES)


def _check_version(meta: dict[str, Any], where: str) -> None:
    version = meta.get(FORMAT_NAME, READABLE_VERSIONS[0])  # no header: a hand-written file
    if version not in READABLE_VERSIONS:
        raise WorkloadFormatError(f"{where}: workload format version {version!r}; this reader "
                                  f"reads {', '.join(map(str, READABLE_VERSIONS))}")


def _open_error(path: str | Path, exc: OSError) -> WorkloadFormatError:
    return WorkloadFormatError(f"cannot read workload {path}: {exc.strerror or exc}")


def _trace_hint(path: str | Path, line: str, exc: WorkloadFormatError) -> WorkloadFormatError:
    """The error of a workload file's first record, saying so where the file is a public
    trace (a Mooncake or ShareGPT file, a CSV given to ``run --workload`` or ``describe``):
    such a file is imported first, not read past with --ignore-unknown-fields."""
    fmt = looks_like(names_in(line)[1])
    if fmt is None:
        return exc
    return WorkloadFormatError(f"{exc}; {path} looks like a trace of --format {fmt}, not a "
                               f"workload file: make one with `replayllm workload import {path} "
                               f"--format {fmt} --out FILE`")


def _read_jsonl(path: str | Path, ignore_unknown: bool) -> Iterator[Request]:
    order = ConversationOrder()
    handle = open_text(path)  # gzip-compressed too, and a byte-order mark skipped
    with handle:
        try:
            first = True
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    item = loads(line, where)
                    if isinstance(item, dict) and FORMAT_NAME in item:
                        if number != 1:
                            raise WorkloadFormatError(f"{where}: a header line may only be "
                                                      "line 1")
                        _check_version(item, where)
                        continue
                    request = request_from_record(item, where, ignore_unknown)
                except WorkloadFormatError as exc:
                    error = exc
                    if first and line.lstrip().startswith("["):  # json.dump of a list
                        error = WorkloadFormatError(
                            f"{where}: a JSON array, not JSON Lines: a workload file holds one "
                            "request object a line (write each with its own json.dumps)")
                    raise _trace_hint(path, line, error) if first else error from None
                first = False
                order.check(request, where)
                yield request
        except TEXT_ERRORS as exc:
            raise read_error(path, exc) from None


def _parquet_file(path: str | Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except OSError as exc:
        raise _open_error(path, exc) from None
    except pa.ArrowInvalid as exc:
        raise WorkloadFormatError(f"{path}: not a Parquet file ({exc})") from None


def _read_parquet(path: str | Path, ignore_unknown: bool) -> Iterator[Request]:
    parquet = _parquet_file(path)
    meta = _parquet_meta(parquet, path)
    _check_version(meta, str(path))
    order = ConversationOrder()
    row = 0
    for batch in parquet.iter_batches(batch_size=ROW_GROUP):
        # Columns null in the whole batch (a file of recipes has no prompt_token_ids) are left
        # out: a missing field and a null one read the same.
        present = [i for i, column in enumerate(batch.columns)
                   if column.null_count < len(column)]
        names = [batch.schema.names[i] for i in present]
        columns = [batch.column(i).to_pylist() for i in present]
        for values in zip(*columns):
            row += 1
            where = f"{path}:row {row}"
            item = {k: v for k, v in zip(names, values) if v is not None}
            request = request_from_record(item, where, ignore_unknown)
            order.check(request, where)
            yield request


def _parquet_meta(parquet: Any, path: str | Path) -> dict[str, Any]:
    raw = (parquet.schema_arrow.metadata or {}).get(FORMAT_NAME.encode())
    if raw is None:
        return {}
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict):
        raise WorkloadFormatError(f"{path}: its {FORMAT_NAME} metadata is not a JSON object")
    return meta


def read_workload(path: str | Path, ignore_unknown_fields: bool = False) -> Iterator[Request]:
    """Yield the requests of a workload file (JSONL or Parquet by suffix), validated, in file
    order. Unknown fields are an error unless ``ignore_unknown_fields``."""
    if is_parquet(path):
        return _read_parquet(path, ignore_unknown_fields)
    return _read_jsonl(path, ignore_unknown_fields)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """A workload file's metadata (the JSONL header line, the Parquet key-value metadata)."""
    if is_parquet(path):
        return _parquet_meta(_parquet_file(path), path)
    try:
        with open_text(path) as handle:
            first = handle.readline()
    except TEXT_ERRORS as exc:
        raise read_error(path, exc) from None
    try:
        item = json.loads(first)
    except (ValueError, RecursionError):  # not JSON, or JSON it cannot take: no header
        return {}
    return item if isinstance(item, dict) and FORMAT_NAME in item else {}


def _parquet_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("prompt_token_ids", pa.list_(pa.int32())), ("prompt", pa.string()),
        ("hash_ids", pa.list_(pa.int64())), ("hash_block_size", pa.int32()),
        ("prompt_len", pa.int32()), ("salt", pa.int64()), ("max_tokens", pa.int32()),
        ("temperature", pa.float64()), ("ignore_eos", pa.bool_()), ("arrival_s", pa.float64()),
        ("conversation_id", pa.string()), ("turn", pa.int32()), ("think_time_s", pa.float64()),
        ("priority", pa.int32()),
    ])


class WorkloadWriter:
    """Writes requests to ``path`` (Parquet or JSONL by suffix) one at a time.

    ``meta`` goes in the header, with what ``close(meta)`` adds (an import's counts, known only
    at the end): rows go to ``PATH.partial`` first, and ``close`` writes the file whole."""

    def __init__(self, path: str | Path, meta: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.meta = {FORMAT_NAME: FORMAT_VERSION, **(meta or {})}
        self.count = 0
        self._rows: list[dict[str, Any]] = []
        self._parquet = is_parquet(path)
        if str(path).lower().endswith(tuple(s + ".gz" for s in PARQUET_SUFFIXES)):
            raise WorkloadFormatError(f"cannot write {path}: Parquet compresses its own columns "
                                      f"(zstd); name it {Path(path).stem}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = (None if self._parquet
                            else open(self._tmp_path(), "w", encoding="utf-8"))
        except OSError as exc:
            raise WorkloadFormatError(f"cannot write {path}: {exc.strerror or exc}") from None
        self._writer: Any = None

    def write(self, request: Request) -> None:
        record = record_from_request(request)
        self.count += 1
        if self._handle is not None:
            self._handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            return
        self._rows.append(record)
        if len(self._rows) >= ROW_GROUP:
            self._flush()

    def write_all(self, requests: Iterable[Request]) -> int:
        """Write every request; if producing or writing one fails, the partial file is removed
        (no ``PATH.partial`` is left behind by a malformed source) and the error raised, one
        line for a write that failed (a full disk: it was a traceback)."""
        try:
            for request in requests:
                self.write(request)
        except OSError as exc:
            self.abort()
            raise self._cannot_write(exc) from None
        except BaseException:
            self.abort()
            raise
        return self.count

    def _cannot_write(self, exc: OSError) -> WorkloadFormatError:
        return WorkloadFormatError(f"cannot write {self.path}: {exc.strerror or exc}; nothing "
                                   "was left there")

    def abort(self) -> None:
        """Give up the file: close and remove what was written so far."""
        try:
            with contextlib.suppress(OSError):  # a full disk fails the last flush too
                if self._handle is not None:
                    self._handle.close()
                if self._writer is not None:
                    self._writer.close()
        finally:
            self._handle = self._writer = None
            self._tmp_path().unlink(missing_ok=True)

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = _parquet_schema()
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp_path(), schema, compression="zstd")
        self._writer.write_table(pa.Table.from_pylist(self._rows, schema=schema))
        self._rows = []

    def _write_jsonl(self, target: Path) -> None:
        """The final JSONL file, written to ``target``: gzip-compressed where its name ends in
        ``.gz`` (as every reader here, ``zcat`` and pandas expect; it was plain text under that
        name), with no time stamp in the gzip header and the final name in it, so the same
        command writes the same bytes."""
        with open(target, "wb") as raw, open(self._tmp_path(), "rb") as rows:
            out: BinaryIO = raw
            if self.path.name.lower().endswith(".gz"):
                out = gzip.GzipFile(self.path.name, "wb", 6, raw, mtime=0)  # type: ignore
            with out:
                out.write((json.dumps(self.meta) + "\n").encode())
                shutil.copyfileobj(rows, out, 1 << 20)

    def _write_parquet(self, target: Path) -> None:
        """The final Parquet file, written to ``target``: the row groups rewritten under the
        final schema, whose metadata (an import's counts) is known only at the end."""
        import pyarrow.parquet as pq

        table = pq.ParquetFile(self._tmp_path())
        schema = table.schema_arrow.with_metadata({FORMAT_NAME: json.dumps(self.meta)})
        with pq.ParquetWriter(target, schema, compression="zstd") as final:
            for group in range(table.num_row_groups):
                final.write_table(table.read_row_group(group).cast(schema))

    def _tmp_path(self) -> Path:
        return self.path.with_name(self.path.name + ".partial")

    def close(self, meta: dict[str, Any] | None = None) -> None:
        """Finish the file; ``meta`` joins the header (an import's counts). The file is
        written whole under a temporary name and renamed (``write_via_temporary``): a failure
        (a full disk) is one line and leaves neither a cut file nor ``PATH.partial``, where it
        was a traceback, a cut file (whole lines: a workload that read, short) and the partial
        one."""
        self.meta.update(meta or {})
        try:
            if self._handle is not None:
                self._handle.close()
                self._handle = None
                write_via_temporary(self.path, self._write_jsonl)
                return
            if self._rows or self._writer is None:
                self._flush()
            self._writer.close()
            self._writer = None
            write_via_temporary(self.path, self._write_parquet)
        except OSError as exc:
            raise self._cannot_write(exc) from None
        finally:
            self.abort()  # the partial file, whatever happened


def load_workload(path: str, ignore_unknown_fields: bool = False) -> list[Request]:
    """Read a workload file (JSONL or Parquet, docs/workloads.md) whole, for a run.

    Raises ``WorkloadFormatError`` (an ``InvalidRequestError``) naming the file, line and field.
    """
    return list(read_workload(path, ignore_unknown_fields=ignore_unknown_fields))
