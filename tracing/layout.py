"""File names of a trace directory, shared by the recorder and the reader.

::

    TRACE/run.json                          header (written once, atomically)
    TRACE/<kind>/seg-000003.parquet         one file per event kind per segment (kinds with rows)
    TRACE/_commits/seg-000003.json          commit marker: segment 3 exists once this file does
    TRACE/summary.json                      written by a clean close only
    TRACE/.replayllm-output.json            who wrote the directory (tracing/outdir.py)
    TRACE/.replayllm.lock                   held by the recording process until it closes

Files in flight have a hidden temporary name (``.seg-000003.parquet.tmp``): pyarrow, pandas and
duckdb's ``*.parquet`` globs all skip names that start with a dot or end in ``.tmp``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tracing.outdir import TRACE_COMMITS, TRACE_HEADER, tmp_name, write_file_atomic
from tracing.schema import EVENT_KINDS

HEADER_FILE = TRACE_HEADER
SUMMARY_FILE = "summary.json"
# ``replayllm export``'s default output, kept inside the trace it describes.
EXPORT_FILE = "trace.json"
# ``replayllm export --format vllm-kv-events``'s default output, also kept inside the trace.
KV_EXPORT_FILE = "kv-events.msgpack"
COMMITS_DIR = TRACE_COMMITS
SEGMENT_PREFIX = "seg-"
SEGMENT_DIGITS = 6
MAX_SEGMENT_DIGITS = 12
PARQUET_SUFFIX = ".parquet"
MARKER_SUFFIX = ".json"
TMP_SUFFIX = ".tmp"
# A segment every this many steps or seconds, whichever comes first (docs/trace-format.md). Each
# flush costs the engine's thread a few milliseconds once (the writer starting up beside it):
# 256-step segments cost a quarter of 64-step ones (BENCHMARKS 8m); the seconds bound what a
# kill loses.
DEFAULT_FLUSH_STEPS = 256
DEFAULT_FLUSH_SECONDS = 2.0
# Where a recorder's segments are written: background threads of the recording process, or a
# child process of its own (tracing/segment_process.py).
TRACE_WRITERS = ("thread", "process")


def segment_stem(index: int) -> str:
    return f"{SEGMENT_PREFIX}{index:0{SEGMENT_DIGITS}d}"


def segment_file(kind: str, index: int) -> str:
    """Path, relative to the trace directory, of one kind's file of segment ``index``."""
    return f"{kind}/{segment_stem(index)}{PARQUET_SUFFIX}"


def marker_file(index: int) -> str:
    return f"{COMMITS_DIR}/{segment_stem(index)}{MARKER_SUFFIX}"


def tmp_path(final: Path) -> Path:
    """The hidden name a file is written under before it is renamed to ``final``."""
    return tmp_name(final)


def trace_entries() -> frozenset[str]:
    """Names a trace directory's top level may hold: what a replayllm command may replace."""
    return frozenset({HEADER_FILE, SUMMARY_FILE, COMMITS_DIR, EXPORT_FILE, KV_EXPORT_FILE,
                      *EVENT_KINDS})


def trace_is_complete(root: Path) -> bool:
    """Whether the trace at ``root`` was closed cleanly (its summary was written)."""
    return (root / SUMMARY_FILE).is_file()


def marker_index(name: str) -> int | None:
    """Segment index of a commit-marker file name, or None if the name is not one."""
    if not (name.startswith(SEGMENT_PREFIX) and name.endswith(MARKER_SUFFIX)):
        return None
    digits = name[len(SEGMENT_PREFIX) : -len(MARKER_SUFFIX)]
    if not (digits.isascii() and digits.isdigit() and len(digits) <= MAX_SEGMENT_DIGITS):
        return None
    index = int(digits)
    # Only the name the recorder writes counts ("seg-3.json" and "seg-0000003.json" do not).
    return index if name == f"{segment_stem(index)}{MARKER_SUFFIX}" else None


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: dict[str, Any], fsync: bool) -> None:
    """Write ``data`` to a temporary name, then rename: readers see the old file or the new one."""
    text = json.dumps(data, indent=2, sort_keys=False, default=_json_default)
    write_file_atomic(path, (text + "\n").encode("utf-8"), fsync)
    if fsync:
        fsync_dir(path.parent)


def _json_default(value: Any) -> Any:
    """Best-effort JSON for header values: numpy scalars, paths, sets, dataclass-like objects."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return value.to_dict()
    return str(value)


def read_json_object(path: str | Path, error: type[Exception], what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a profile, a saved model): ``error`` naming the file and
    ``what`` it should be when it cannot be read, is not JSON or holds no object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    except ValueError as exc:  # not JSON, or not UTF-8
        raise error(f"{path}: not a {what} file ({exc})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: not a {what} file (a JSON {type(data).__name__}, not an object)")
    return data
