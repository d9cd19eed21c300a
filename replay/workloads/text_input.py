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
import itertools
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from replay.workloads.fields import WorkloadFormatError
from replay.workloads.formats import names_in, not_format

GZIP_MAGIC = b"\x1f\x8b"
OTHER_COMPRESSIONS = {b"PK\x03\x04": "zip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2",
                      b"\xfd7zXZ\x00": "xz"}
ARRAY_CHUNK = 1 << 20  # characters of a JSON array read at a time (more for a longer element)
TEXT_ERRORS = (UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error)


def read_error(path: str | Path, exc: BaseException) -> WorkloadFormatError:
    """The one-line error of a failure while reading ``path``'s text."""
    if isinstance(exc, UnicodeDecodeError):
        return WorkloadFormatError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile):
        return WorkloadFormatError(f"cannot read {path}: {exc.strerror or exc}")
    return WorkloadFormatError(f"{path}: corrupt or truncated gzip data ({exc or 'end of file'})")


def open_text(path: str | Path, newline: str | None = None) -> IO[str]:
    """``path`` as UTF-8 text (gzip decompressed, a byte-order mark skipped)."""
    try:
        with open(path, "rb") as raw:
            magic = raw.read(6)
        for prefix, name in OTHER_COMPRESSIONS.items():
            if magic.startswith(prefix):
                raise WorkloadFormatError(f"{path}: {name}-compressed; decompress it first "
                                          "(gzip is read directly)")
        if magic.startswith(GZIP_MAGIC):
            return gzip.open(path, "rt", encoding="utf-8-sig", newline=newline)
        return open(path, encoding="utf-8-sig", newline=newline)
    except OSError as exc:
        raise read_error(path, exc) from None


def json_records(path: str | Path, fmt: str | None = None) -> Iterator[tuple[str, Any]]:
    """(where, value) of each record of a JSON Lines file (``path:LINE``; blank lines skipped)
    or of a JSON array (``path: element N``, from 0). A first line that is not JSON is, for an
    importer's ``fmt``, the error naming what it holds (a CSV's columns) and the formats read."""
    handle = open_text(path)
    with handle:
        try:
            first, skipped = handle.readline(), 0
            while first and not first.strip():
                first, skipped = handle.readline(), skipped + 1
            if not first:
                return  # empty, or blank lines only
            if first.lstrip().startswith("["):
                yield from _array(path, handle, "\n" * skipped + first)
                return
            try:
                value = loads(first, f"{path}:{skipped + 1}")
            except WorkloadFormatError as exc:
                raise (exc if fmt is None else not_format(str(exc), fmt, names_in(first))
                       ) from None
            yield f"{path}:{skipped + 1}", value
            for number, line in enumerate(handle, skipped + 2):
                if line.strip():
                    yield f"{path}:{number}", loads(line, f"{path}:{number}")
        except TEXT_ERRORS as exc:
            raise read_error(path, exc) from None


def loads(text: str, where: str) -> Any:
    """One JSON value (a line of a JSON Lines file); every way it is not JSON is one line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadFormatError(f"{where}: not JSON ({exc.msg}, column {exc.colno})") from None
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
    dropped at line starts (``line`` counts the lines dropped), so a 600 MB ShareGPT array holds
    one chunk and one element in memory at a time, never the whole file as Python objects."""

    def __init__(self, path: str | Path, handle: IO[str], start: str) -> None:
        self.path, self.handle, self.text = path, handle, start
        self.pos, self.line, self.eof, self.chunk = start.index("[") + 1, 0, False, ARRAY_CHUNK

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
        cut = self.text.rfind("\n", 0, self.pos) + 1
        if cut > ARRAY_CHUNK:
            self.line += self.text.count("\n", 0, cut)
            self.text, self.pos, self.chunk = self.text[cut:], self.pos - cut, ARRAY_CHUNK

    def error(self, message: str, at: int | None = None) -> WorkloadFormatError:
        at = self.pos if at is None else at
        line = self.line + self.text.count("\n", 0, at) + 1
        column = at - self.text.rfind("\n", 0, at)
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
    """(``path: element N``, value) of each element of a JSON array, decoded one at a time."""
    text, decoder = _ArrayText(path, handle, start), json.JSONDecoder()
    for number in itertools.count():
        char = text.next_char()
        if char == "]" and number == 0:
            text.pos += 1
            break
        if not char:
            raise text.error("Expecting value" if number == 0 else "Expecting ',' delimiter")
        while True:
            try:
                value, end = decoder.raw_decode(text.text, text.pos)
            except json.JSONDecodeError as exc:
                if text.read_more():
                    continue  # the element goes on in the next chunk
                raise text.error(exc.msg, exc.pos) from None
            except (RecursionError, ValueError) as exc:
                raise WorkloadFormatError(f"{path}: element {number}: not JSON "
                                          f"({_unreadable(exc)})") from None
            if not _cut(value, text.text, end) or not text.read_more():
                break  # else a number at the chunk's end may go on: decode it again
        text.pos = end
        yield f"{path}: element {number}", value
        separator = text.next_char()
        text.pos += 1
        if separator == "]":
            break
        if separator != ",":
            raise text.error("Expecting ',' delimiter", text.pos - 1)
        text.consumed()
    if text.next_char():
        raise text.error("Extra data")
