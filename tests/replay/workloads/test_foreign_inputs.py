"""Inputs the importers and the generator were not tuned to (session 33, docs/TESTING.md): a
source read through a pipe (``/dev/stdin``, ``<(zcat trace.csv.gz)``), and the number files of
``--schedule`` and ``empirical:FILE`` read as every trace is (gzip, a byte-order mark, CRLF,
bytes that are not UTF-8), their errors naming the file's real line."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from engine.errors import InvalidRequestError
from replay.workloads.arrivals import ArrivalProcess
from replay.workloads.distributions import parse
from replay.workloads.generate import GenerateSpec
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2024-05-10 00:00:00.009930+00:00,100,10\n"
         "2024-05-10 00:00:00.02+00:00,200,20\n"
         "2024-05-10 00:00:01+00:00,300,30\n")
MOONCAKE = ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
            '{"timestamp": 3000, "input_length": 512, "output_length": 7, "hash_ids": [1]}\n')


def imported(path: str | Path, fmt: str) -> list[tuple[object, ...]]:
    counts = ImportCounts()
    return [(r.prompt, r.max_tokens, r.arrival_s)
            for r in import_workload(path, fmt, ImportOptions(), counts)]


@contextmanager
def piped(data: bytes) -> Iterator[str]:
    """``data`` behind a pipe, as ``/dev/fd/N`` (what ``<(zcat f)`` and ``/dev/stdin`` give):
    a file that cannot seek, whose bytes are gone once read."""
    read_end, write_end = os.pipe()
    os.write(write_end, data)  # small: fits the pipe's buffer
    os.close(write_end)
    try:
        yield f"/dev/fd/{read_end}"
    finally:
        os.close(read_end)


@pytest.mark.parametrize("fmt, text", [("azure", AZURE), ("mooncake", MOONCAKE)])
@pytest.mark.parametrize("compress", [False, True])
def test_a_source_through_a_pipe_reads_as_the_file(tmp_path: Path, fmt: str, text: str,
                                                   compress: bool) -> None:
    """A trace piped in reads as the plain file does, gzip-compressed too. Before: the file was
    opened twice (once to read its first bytes for the compression), so a pipe's first buffer
    was gone: ``empty file: not an Azure LLM inference CSV``, ``holds no requests``."""
    data = gzip.compress(text.encode()) if compress else text.encode()
    plain = tmp_path / "trace"
    plain.write_text(text)
    with piped(data) as path:
        assert imported(path, fmt) == imported(plain, fmt)


def test_schedule_and_empirical_files_read_as_traces_do(tmp_path: Path) -> None:
    """A ``--schedule`` or ``empirical:FILE`` file with a byte-order mark and CRLF line ends,
    or gzip-compressed, gives the plain file's values. Before: ``not a time: '\\ufeff0'`` and
    a ``UnicodeDecodeError`` traceback for the gzip file."""
    plain = tmp_path / "plain.txt"
    plain.write_text("0\n0.5\n2.25\n")
    marked = tmp_path / "marked.txt"
    marked.write_bytes(b"\xef\xbb\xbf0\r\n0.5\r\n2.25\r\n")
    packed = tmp_path / "times.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, marked, packed):
        process = ArrivalProcess("schedule", schedule=str(path))
        times = np.concatenate(list(process.times(3, np.random.default_rng(0))))
        assert times.tolist() == [0.0, 0.5, 2.25]
        assert parse(f"empirical:{path}").values == (0.0, 0.5, 2.25)


def schedule(path: Path, n: int = 2) -> list[float]:
    process = ArrivalProcess("schedule", schedule=str(path))
    return np.concatenate(list(process.times(n, np.random.default_rng(0)))).tolist()


@pytest.mark.parametrize("content, message", [
    # Each bad value among the two times read (n = 2): a schedule is read no further than the
    # times it gives (session 38), so a bad line past them is not an error.
    (b"0\n\n\nsoon\n", r"t.txt:4: not a number: 'soon'$"),
    (b"2\n\n1\n", r"t.txt:3: 1 is before the time above it \(2\)"),
    (b"0\n\n\n-1\n", r"t.txt:4: a time must be finite and >= 0, got -1$"),
    (b"0\n1\xff\n", r"t.txt:2: not UTF-8 text \(invalid start byte at byte 2 of the line\)$"),
    (b"PK\x03\x04zipped", r"^--schedule: .*t.txt: zip-compressed; decompress it first"),
])
def test_schedule_errors_name_the_real_line(tmp_path: Path, content: bytes,
                                            message: str) -> None:
    """Errors in a schedule name the line the value is on (before: its count of numbers,
    blank lines not counted: ``t.txt:3`` for line 5) and bytes that are not UTF-8 are one line
    (before: a ``UnicodeDecodeError`` traceback)."""
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(InvalidRequestError, match=message):
        schedule(path)


@pytest.mark.parametrize("content, message", [
    (b"7\n\n\nseven\n", r"t.txt:4: not a number: 'seven'$"),
    (b"7\n\n-3\n", r"t.txt:3: must be finite and >= 0, got -3$"),
    (b"\xff7\n", r"t.txt:1: not UTF-8 text \(invalid start byte at byte 1 of the line\)$"),
])
def test_empirical_errors_name_the_real_line(tmp_path: Path, content: bytes,
                                             message: str) -> None:
    """The same rule for ``empirical:FILE`` (one reader of number files for both)."""
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(InvalidRequestError, match=message):
        parse(f"empirical:{path}", "--prompt-len")


@pytest.mark.parametrize("make", [
    lambda size: ImportOptions(block_size=size),
    lambda size: GenerateSpec(num_requests=1, system_prompts=1, hash_block_size=size),
])
def test_a_block_size_past_the_limit_names_the_range(make: object) -> None:
    """``--block-size`` (import) and ``--hash-block-size`` (generate) over 2^20 said ``must be
    >= 1, got 99999999999``; the message now names the range both ends are checked against."""
    for size in (0, 99_999_999_999):
        with pytest.raises(InvalidRequestError, match=rf"block-size must be in \[1, 1048576\], "
                           rf"got {size}$"):
            make(size)  # type: ignore[operator]


@pytest.mark.parametrize("fmt, line", [
    ("azure", "2023-11-16 18:17:03.9799600,4808,10\n"),
    ("mooncake", '{"timestamp": 0, "input_length": 4808, "output_length": 10}\n'),
])
@pytest.mark.parametrize("compress", [False, True])
def test_bytes_not_utf8_far_in_are_named_by_line(tmp_path: Path, fmt: str, line: str,
                                                 compress: bool) -> None:
    """A byte that is not UTF-8 at 90 KB of a trace was ``not UTF-8 text (invalid
    continuation byte at byte 4016)``: the decoder's offset in its 8 KB chunk, not in the file,
    and no line. The error now names the line and the byte of the line (a gzip file's
    decompressed lines too); a pipe, which cannot be read again, gets no offset at all."""
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n" if fmt == "azure" else ""
    lines = [header] + [line] * 3000
    bad = 2500  # this line gets a Latin-1 "é" in place of its "4" of 4808
    lines[bad] = lines[bad].replace("4808", "\xe9808")
    data = "".join(lines).encode("latin-1")
    assert data.index(b"\xe9") > 80_000
    path = tmp_path / "t"
    path.write_bytes(gzip.compress(data) if compress else data)
    column = lines[bad].index("\xe9") + 1
    with pytest.raises(InvalidRequestError, match=rf"t:{bad + (1 if header else 0)}: not UTF-8 "
                       rf"text \(invalid continuation byte at byte {column} of the line\)$"):
        imported(path, fmt)
    with piped(data[:60_000] + b"\xe9\n") as pipe:
        with pytest.raises(InvalidRequestError, match=r"^/dev/fd/\d+: not UTF-8 text \(invalid "
                           r"continuation byte\)$"):
            imported(pipe, fmt)
