"""Opening trace files as text, the one way every importer does it.

Public traces ship compressed and are edited on every platform, so a file is read by its
contents, not its name: gzip (``.gz``, or gzip bytes under any name) is decompressed while
streaming; other compressions (zip, zstd, bzip2, xz) are named in the error, to decompress first;
a UTF-8 byte-order mark is skipped; CRLF line ends read as LF. ``json_records`` reads a JSON
array (decoded one element at a time) or JSON Lines alike (told apart by the first character).
Every failure raises ``WorkloadFormatError`` in one line naming the file.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from replay.workloads.fields import WorkloadFormatError
from replay.workloads.formats import names_in, not_format

GZIP_MAGIC = b"\x1f\x8b"
OTHER_COMPRESSIONS = {b"PK\x03\x04": "zip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2",
                      b"\xfd7zXZ\x00": "xz"}
PEEK_CHARS = 4096  # characters read to tell a JSON array from JSON Lines
ARRAY_CHUNK = 1 << 20  # characters of a JSON array read at a time (more for a longer element)
TEXT_ERRORS = (UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error)
PARQUET_MAGIC, PARQUET_BATCH = b"PAR1", 1024  # rows a batch (a chat row may be 100 KB)


def read_error(path: str | Path, exc: BaseException) -> WorkloadFormatError:
    """The one-line error of a failure while reading ``path``'s text."""
    if isinstance(exc, UnicodeDecodeError):
        found = _undecodable(path)
        if found is None:  # a pipe, read once: where its bytes were is not known
            return WorkloadFormatError(f"{path}: not UTF-8 text ({exc.reason})")
        line, column, reason = found
        return WorkloadFormatError(f"{path}:{line}: not UTF-8 text ({reason} at byte {column} "
                                   "of the line)")
    if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile):
        return WorkloadFormatError(f"cannot read {path}: {exc.strerror or exc}")
    return WorkloadFormatError(f"{path}: corrupt or truncated gzip data ({exc or 'end of file'})")


def _undecodable(path: str | Path) -> tuple[int, int, str] | None:
    """(line, byte of the line from 1, reason) of the first bytes of ``path`` (decompressed)
    that are not UTF-8, found by reading the file again: a decoder's error knows only its
    offset in the chunk it was given (``at byte 4016`` for a byte 90 KB in). None for a pipe,
    which cannot be read again. A line end never lies inside a UTF-8 character, so each line
    decodes alone."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as raw:
            packed = raw.read(len(GZIP_MAGIC)) == GZIP_MAGIC
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if packed else raw
            for number, line in enumerate(stream, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    return number, exc.start + 1, exc.reason
    except (OSError, EOFError, zlib.error):
        return None
    return None


class _Prefixed(io.RawIOBase):
    """A stream that cannot seek back (a pipe, ``/dev/stdin``, ``<(zcat f)``), its first bytes,
    read to tell its compression, put back in front: such a file can be opened only once."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n], self.head = self.head[:n], self.head[n:]
            return n
        return self.rest.readinto(buffer)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.rest.close()
        super().close()


class _Text(io.TextIOWrapper):
    """Text over a gzip stream that also closes the file under it (a ``GzipFile`` given a
    file object leaves it open)."""

    def __init__(self, binary: IO[bytes], under: IO[bytes], newline: str | None) -> None:
        super().__init__(binary, encoding="utf-8-sig", newline=newline)
        self.under = under

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.under.close()


def open_text(path: str | Path, newline: str | None = None) -> IO[str]:
    """``path`` as UTF-8 text (gzip decompressed, a byte-order mark skipped). The file is
    opened once, so a pipe (``/dev/stdin``, ``<(zcat trace.csv.gz)``) reads whole: opening it
    a second time found its first bytes gone (an "empty file")."""
    try:
        raw: IO[bytes] = open(path, "rb")
    except OSError as exc:
        raise read_error(path, exc) from None
    try:
        magic = raw.read(6)
        if raw.seekable():
            raw.seek(0)
        else:
            raw = io.BufferedReader(_Prefixed(magic, raw))
        if magic.startswith(PARQUET_MAGIC):
            raise WorkloadFormatError(f"{path}: a Parquet file, not text: azure and burstgpt "
                                      "read CSV (a workload file in Parquet is named .parquet)")
        for prefix, name in OTHER_COMPRESSIONS.items():
            if magic.startswith(prefix):
                raise WorkloadFormatError(f"{path}: {name}-compressed; decompress it first "
                                          "(gzip is read directly)")
        if magic.startswith(GZIP_MAGIC):
            return _Text(gzip.GzipFile(fileobj=raw, mode="rb"), raw, newline)
        return io.TextIOWrapper(raw, encoding="utf-8-sig", newline=newline)
    except OSError as exc:
        raw.close()
        raise read_error(path, exc) from None
    except BaseException:
        raw.close()
        raise


def _is_parquet(path: str | Path) -> bool:
    """Whether ``path`` is a Parquet file, told by its first bytes (a pipe never is: Parquet is
    read from its end, and a pipe must not be opened twice)."""
    try:
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as raw:
            return raw.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    except OSError:
        return False


def _parquet_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """(``path:row N``, record) of each row of a Parquet file (Hugging Face publishes
    LMSYS-Chat-1M, WildChat and many chat sets so), a null being an absent field, as in a
    workload file; read in batches, never whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise WorkloadFormatError(f"{path}: not a readable Parquet file ({_first_line(exc)})"
                                  ) from None
    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH):
            for record in batch.to_pylist():
                row += 1
                yield f"{path}:row {row}", {k: v for k, v in record.items() if v is not None}
    except (OSError, pa.ArrowException) as exc:
        raise WorkloadFormatError(f"{path}:row {row + 1}: cannot read the Parquet file "
                                  f"({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def json_records(path: str | Path, fmt: str | None = None) -> Iterator[tuple[str, Any]]:
    """(where, value) of each record of a JSON Lines file (``path:LINE``; blank lines skipped),
    of a JSON array (``path:LINE: element N``, N from 0) or of a Parquet file (``path:row N``).
    A first line that is not JSON is, for an importer's ``fmt``, the error naming what it holds
    (a CSV's columns) and the formats read."""
    if _is_parquet(path):
        yield from _parquet_records(path)
        return
    handle = open_text(path)
    with handle:
        try:
            # The first characters tell an array from JSON Lines: never the first line, which
            # is the whole file for an array on one line (``json.dump`` without ``indent``).
            head = handle.read(PEEK_CHARS)
            while head and not head.strip() and (more := handle.read(PEEK_CHARS)):
                head += more
            if not head.strip():
                return  # empty, or blank lines only
            if head.lstrip().startswith("["):
                yield from _array(path, handle, head)
                return
            if not head.endswith("\n"):
                head += handle.readline()  # the line the peek cut, whole
            first = True
            for number, line in enumerate(itertools.chain(io.StringIO(head), handle), 1):
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    value = loads(line, where)
                except NotJsonLines as exc:  # JSON, so no CSV columns to name
                    raise WorkloadFormatError(f"{exc}; a JSON array of the records is read too"
                                              ) from None
                except WorkloadFormatError as exc:
                    raise (not_format(str(exc), fmt, names_in(line)) if first and fmt
                           else exc) from None
                first = False
                yield where, value
        except TEXT_ERRORS as exc:
            raise read_error(path, exc) from None


class NotJsonLines(WorkloadFormatError):
    """A line whose JSON value goes on past its line end: one value spread over several lines
    (a pretty-printed file), which is JSON but not JSON Lines. Its own class so that an
    importer does not read the line (``{``) as a CSV header and list it as "columns found"."""


def loads(text: str, where: str) -> Any:
    """One JSON value (a line of a JSON Lines file); every way it is not JSON is one line.
    A line with no line end whose JSON stops unfinished is the file's last, cut short (a copy
    or a write not finished): said so, where it read as any syntax error. One with a line end
    is a value spread over lines (``NotJsonLines``): a pretty-printed file, as the Mooncake
    README shows its sample, read as "Expecting property name" at a line ``{``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        unfinished = exc.pos >= len(text.rstrip())
        # a line end inside a string is never pretty-printing (JSON escapes it): not JSON
        if text.endswith("\n") and unfinished and not exc.msg.startswith("Invalid control"):
            kind = {"{": "object", "[": "array"}.get(text.lstrip()[:1], "value")
            raise NotJsonLines(
                f"{where}: not JSON Lines: the JSON {kind} goes on past the end of the line "
                "(one value spread over several lines: a pretty-printed file?); JSON Lines "
                "holds each value whole on one line (json.dumps without indent)") from None
        cut = not text.endswith("\n") and (unfinished
                                            or exc.msg.startswith("Unterminated string"))
        raise WorkloadFormatError(
            f"{where}: not JSON ({exc.msg}, column {exc.colno})"
            + ("; the file's last line, cut short (no line end): a copy or a write not "
               "finished?" if cut else "")) from None
    except (RecursionError, ValueError) as exc:
        raise WorkloadFormatError(f"{where}: not JSON ({_unreadable(exc)})") from None


def _unreadable(exc: BaseException) -> str:
    """What ``json.loads`` could not take beyond a syntax error: nesting past the recursion
    limit, an integer past Python's 4,300-digit limit on converting a string."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return f"a number too long to read: {str(exc).split(';')[0]}"


class _ArrayText:
    """A JSON array's text, read in chunks: ``text[pos:]`` is unread; what is consumed is
    dropped after an element's comma (``line`` counts the lines dropped, ``column`` the
    characters of ``text``'s first line dropped before it), so a 600 MB ShareGPT array holds
    one chunk and one element in memory at a time, never the whole file as Python objects,
    whether pretty-printed or on one line (``json.dump`` without ``indent``: it was dropped at
    line starts only, and a one-line array was held whole)."""

    def __init__(self, path: str | Path, handle: IO[str], start: str) -> None:
        self.path, self.handle, self.text = path, handle, start
        self.pos, self.line, self.eof, self.chunk = start.index("[") + 1, 0, False, ARRAY_CHUNK
        self.mark = self.mark_lines = 0  # line ends counted in ``text[:mark]``
        self.column = 0  # characters of text's first line before text[0]

    def line_at(self, at: int) -> int:
        """The line of ``text[at]`` (``at`` not before the last one asked), counting only the
        text since then: every element's line costs one pass over the file in all."""
        self.mark_lines += self.text.count("\n", self.mark, at)
        self.mark = at
        return self.line + self.mark_lines + 1

    def read_more(self) -> bool:
        """Append a chunk (each larger than the last while one element spans them)."""
        data = "" if self.eof else self.handle.read(self.chunk)
        self.eof, self.chunk = not data, self.chunk * 2
        self.text += data
        return bool(data)

    def next_char(self) -> str:
        """The next non-space character, from ``pos`` on ('' at the end of the file)."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.text) or not self.read_more():
                return self.text[self.pos:self.pos + 1]

    def consumed(self) -> None:
        """Drop the text read so far (the elements decoded), once it is a chunk's worth."""
        cut = self.pos
        if cut > ARRAY_CHUNK:
            self.line = self.line_at(cut) - 1
            line_start = self.text.rfind("\n", 0, cut) + 1
            self.column = cut - line_start + (self.column if not line_start else 0)
            self.text, self.pos, self.chunk = self.text[cut:], 0, ARRAY_CHUNK
            self.mark = self.mark_lines = 0

    def error(self, message: str, at: int | None = None) -> WorkloadFormatError:
        at = self.pos if at is None else at
        line = self.line + self.text.count("\n", 0, at) + 1
        line_start = self.text.rfind("\n", 0, at) + 1
        column = at - line_start + 1 + (self.column if not line_start else 0)
        return WorkloadFormatError(f"{self.path}:{line}: not a JSON array ({message}, column "
                                   f"{column})")


def _cut(value: Any, text: str, end: int) -> bool:
    """Whether a number decoded from ``text`` up to ``end`` may go on past the chunk (``-1``
    of ``-1.5``): a number is told complete only by the next character (an array, an object
    or a string by their own closing one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    following = text[end:end + 64].lstrip()[:1] or text[end:].lstrip()[:1]
    return not following or following in "0123456789.eE+-"


def _array(path: str | Path, handle: IO[str], start: str) -> Iterator[tuple[str, Any]]:
    """(``path:LINE: element N``, value) of each element of a JSON array, decoded one at a
    time; LINE is where the element starts (a pretty-printed 600 MB ShareGPT file has ~15 M)."""
    text, decoder = _ArrayText(path, handle, start), json.JSONDecoder()
    for number in itertools.count():
        char = text.next_char()
        if char == "]" and number == 0:
            text.pos += 1
            break
        if not char:
            raise text.error("Expecting value" if number == 0 else "Expecting ',' delimiter")
        where = f"{path}:{text.line_at(text.pos)}: element {number}"
        while True:
            try:
                value, end = decoder.raw_decode(text.text, text.pos)
            except json.JSONDecodeError as exc:
                if text.read_more():
                    continue  # the element goes on in the next chunk
                raise text.error(exc.msg, exc.pos) from None
            except (RecursionError, ValueError) as exc:
                raise WorkloadFormatError(f"{where}: not JSON ({_unreadable(exc)})") from None
            if not _cut(value, text.text, end) or not text.read_more():
                break  # else a number at the chunk's end may go on: decode it again
        text.pos = end
        yield where, value
        separator = text.next_char()
        text.pos += 1
        if separator == "]":
            break
        if separator != ",":
            raise text.error("Expecting ',' delimiter", text.pos - 1)
        text.consumed()
    if text.next_char():
        raise text.error("Extra data")


def numbers(path: str | Path, what: str) -> Iterator[tuple[str, float]]:
    """(``path:LINE``, value) of each number of a file of numbers, one a line (or several,
    whitespace between): ``--schedule`` and ``empirical:FILE``. Read as every trace is
    (gzip, a byte-order mark, CRLF); a word that is not a number, bytes that are not UTF-8 or a
    file that cannot be opened (``what``, the option, named) are one line."""
    try:
        handle = open_text(path)
    except WorkloadFormatError as exc:
        raise WorkloadFormatError(f"{what}: {exc}") from None
    with handle:
        try:
            for number, line in enumerate(handle, 1):
                for word in line.split():
                    try:
                        value = float(word)
                    except ValueError:
                        raise WorkloadFormatError(f"{path}:{number}: not a number: {word!r}"
                                                  ) from None
                    yield f"{path}:{number}", value
        except TEXT_ERRORS as exc:
            raise read_error(path, exc) from None
