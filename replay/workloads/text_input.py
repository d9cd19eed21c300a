"""Opening trace files as text, the one way every importer does it.

Public traces ship compressed and are edited on every platform, so a file is read by its
contents, not its name: gzip (``.gz``, or gzip bytes under any name) is decompressed while
streaming; other compressions (zip, zstd, bzip2, xz) are named in the error, to decompress first;
a UTF-8 byte-order mark is skipped; CRLF line ends read as LF. ``json_records`` reads a JSON
array or JSON Lines alike (told apart by the first character). Every failure raises
``WorkloadFormatError`` in one line naming the file.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from replay.workloads.fields import WorkloadFormatError

GZIP_MAGIC = b"\x1f\x8b"
OTHER_COMPRESSIONS = {b"PK\x03\x04": "zip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2",
                      b"\xfd7zXZ\x00": "xz"}
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


def json_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """(where, value) of each record of a JSON Lines file (``path:LINE``; blank lines skipped)
    or of a JSON array (``path: element N``, from 0)."""
    handle = open_text(path)
    with handle:
        try:
            first, skipped = handle.readline(), 0
            while first and not first.strip():
                first, skipped = handle.readline(), skipped + 1
            if not first:
                return  # empty, or blank lines only
            if first.lstrip().startswith("["):
                yield from _array(path, "\n" * skipped + first + handle.read())
                return
            for number, line in enumerate(_prepend(first, handle), skipped + 1):
                if line.strip():
                    yield f"{path}:{number}", loads(line, f"{path}:{number}")
        except TEXT_ERRORS as exc:
            raise read_error(path, exc) from None


def _prepend(first: str, handle: IO[str]) -> Iterator[str]:
    yield first
    yield from handle


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


def _array(path: str | Path, text: str) -> Iterator[tuple[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadFormatError(f"{path}:{exc.lineno}: not a JSON array ({exc.msg}, column "
                                  f"{exc.colno})") from None
    except (RecursionError, ValueError) as exc:
        raise WorkloadFormatError(f"{path}: not JSON ({_unreadable(exc)})") from None
    for number, item in enumerate(data):
        yield f"{path}: element {number}", item
