"""Checks of a trace's JSON (header, commit markers) before any value sizes what a reader builds.

A header or marker is input like any other: a value of the wrong type, a non-finite number, a
path leading out of the trace or a count large enough to make a replay allocate billions of
blocks is a ``TraceError`` naming the file and the field, before any reader uses it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tracing.errors import TraceError
from tracing.layout import segment_file
from tracing.schema import EVENT_KINDS, READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# The largest KV pool a trace may describe: a replay builds one Python object per block, so a
# header claiming 2^31 blocks would take the reader's memory (a 140 GB GPU holds ~10^4 blocks).
MAX_TRACE_BLOCKS = 2**22
MAX_BLOCK_SIZE = 65536
# Header lists (calibration rows, captured graph sizes): far above what the engine writes.
MAX_HEADER_LIST = 100_000
STEP_KINDS = ("prefill", "decode", "mixed")
# Header fields that readers format or look up as text (inspect, whatif's device notes).
HEADER_STRINGS = ("device", "attention_backend", "git_commit", "start_time", "model_path",
                  "policy")
EXECUTOR_STRINGS = ("executor", "device", "device_name", "dtype", "attention_backend")
# Calibration row fields (engine/calibration.py): integer features and measured seconds.
CALIBRATION_INTS = ("num_seqs", "prefill_tokens", "prefill_attn_work", "decode_seqs",
                    "decode_context_tokens", "padded_batch_size")
CALIBRATION_OPTIONAL_INTS = ("padded_tokens", "repeats")
CALIBRATION_SECONDS = ("interval_s",)
# The longest a timed step (a calibration's or a profile's row) may take: past an hour it is an
# edit or a broken clock, and fitted it prices a run at absurd lengths without a word.
MAX_STEP_S = 3600.0
CALIBRATION_OPTIONAL_SECONDS = ("duration_s", "wait_s", "interval_p10_s", "interval_p90_s")
# What a device profile's row adds to a calibration row (engine/profiling.run_profile).
PROFILE_OPTIONAL_INTS = ("level", "decode_context_max", "cached_tokens", "prefix_groups",
                         "prefix_tokens")


def is_int(value: Any, low: int, high: int) -> bool:
    """An int (never a bool) in ``[low, high]``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def is_seconds(value: Any) -> bool:
    """A finite number >= 0 (never a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def check_header(path: Path, header: dict[str, Any]) -> None:
    """Raise ``TraceError`` for a header this release cannot read, or one whose values are out of
    type or bounds: schema version, pool and block sizes, config, executor, calibration rows."""
    version = header.get("schema_version")
    if version is None:
        raise TraceError(f"{path}: no schema_version; not a replayllm trace header")
    if not is_int(version, 0, INT32_MAX) or version not in READABLE_SCHEMA_VERSIONS:
        readable = ", ".join(str(v) for v in READABLE_SCHEMA_VERSIONS)
        raise TraceError(
            f"{path}: trace schema version {version!r}, but this replayllm reads versions "
            f"{readable} (current {SCHEMA_VERSION}); use the replayllm release that recorded it"
        )
    _optional_int(path, header, "block_size", 1, MAX_BLOCK_SIZE)
    _optional_int(path, header, "num_blocks", 1, MAX_TRACE_BLOCKS)
    _optional_types(path, header, HEADER_STRINGS, str, "")
    _optional_types(path, header, ("model",), dict, "")
    config = header.get("config")
    if config is not None:
        if not isinstance(config, dict):
            raise TraceError(f"{path}: config must be a JSON object, got {type(config).__name__}")
        _optional_int(path, config, "num_kvcache_blocks", 1, MAX_TRACE_BLOCKS, "config.",
                      allow=(-1,))
        _optional_int(path, config, "kvcache_block_size", 1, MAX_BLOCK_SIZE, "config.")
    executor = header.get("executor")
    if executor is not None:
        if not isinstance(executor, dict):
            raise TraceError(f"{path}: executor must be a JSON object")
        _optional_types(path, executor, EXECUTOR_STRINGS, str, "executor.")
        _optional_types(path, executor, ("model",), dict, "executor.")
        for key in ("prefill_graph_tokens", "graph_batch_sizes"):
            _int_list(path, executor, key, "executor.")
        _optional_int(path, executor, "prefill_graph_max_seqs", 0, INT32_MAX, "executor.")
    calibration = header.get("calibration")
    if calibration is not None:
        if not isinstance(calibration, list) or len(calibration) > MAX_HEADER_LIST:
            raise TraceError(f"{path}: calibration must be a list of at most {MAX_HEADER_LIST} "
                             "rows")
        for i, row in enumerate(calibration):
            _check_calibration_row(path, i, row)


def _optional_int(path: Path, data: dict[str, Any], key: str, low: int, high: int,
                  prefix: str = "", allow: tuple[int, ...] = ()) -> None:
    value = data.get(key)
    if value is None or (value in allow and is_int(value, -INT64_MAX, INT64_MAX)):
        return
    if not is_int(value, low, high):
        raise TraceError(f"{path}: {prefix}{key} must be an integer in [{low}, {high}], "
                         f"got {value!r}")


def _optional_types(path: Path, data: dict[str, Any], keys: tuple[str, ...], kind: type,
                    prefix: str) -> None:
    """Each of ``keys`` absent, null or of type ``kind`` (a string, a JSON object)."""
    for key in keys:
        value = data.get(key)
        if value is not None and not isinstance(value, kind):
            what = "a string" if kind is str else "a JSON object"
            raise TraceError(f"{path}: {prefix}{key} must be {what}, got {value!r}")


def _int_list(path: Path, data: dict[str, Any], key: str, prefix: str) -> None:
    value = data.get(key)
    if value is None:
        return
    if (not isinstance(value, list) or len(value) > MAX_HEADER_LIST
            or not all(is_int(v, 0, INT32_MAX) for v in value)):
        raise TraceError(f"{path}: {prefix}{key} must be a list of integers in [0, {INT32_MAX}]")


def _check_calibration_row(path: Path, index: int, row: Any, what: str = "calibration row"
                           ) -> None:
    where = f"{path}: {what} {index}"
    if not isinstance(row, dict):
        raise TraceError(f"{where} must be a JSON object, got {type(row).__name__}")
    if row.get("kind") not in STEP_KINDS:
        raise TraceError(f"{where}: kind must be one of {', '.join(STEP_KINDS)}, "
                         f"got {row.get('kind')!r}")
    if not isinstance(row.get("graph_used"), bool):
        raise TraceError(f"{where}: graph_used must be true or false, "
                         f"got {row.get('graph_used')!r}")
    for key in CALIBRATION_INTS:
        if not is_int(row.get(key), 0, INT64_MAX):
            raise TraceError(f"{where}: {key} must be an integer >= 0, got {row.get(key)!r}")
    for key in CALIBRATION_OPTIONAL_INTS:
        if key in row and not is_int(row[key], 0, INT64_MAX):
            raise TraceError(f"{where}: {key} must be an integer >= 0, got {row[key]!r}")
    for key in CALIBRATION_SECONDS + CALIBRATION_OPTIONAL_SECONDS:
        value = row.get(key)
        if value is None and key in CALIBRATION_OPTIONAL_SECONDS:
            continue
        if not (is_seconds(value) and value <= MAX_STEP_S):
            raise TraceError(f"{where}: {key} must be a finite number of seconds in "
                             f"[0, {MAX_STEP_S:g}], got {value!r}")


def check_marker(path: Path, index: int, data: dict[str, Any]) -> None:
    """Raise ``TraceError`` unless commit marker ``data`` (of segment ``index``) is well formed:
    its segment number, its step and event-id range, and one entry per kind naming exactly that
    kind's file of this segment (never a path elsewhere) with a row count."""
    if not is_int(data.get("segment"), index, index):
        raise TraceError(f"{path}: malformed commit marker (segment is {data.get('segment')!r}, "
                         f"expected {index})")
    if not is_int(data.get("through_step"), -1, INT32_MAX):
        raise TraceError(f"{path}: malformed commit marker (through_step "
                         f"{data.get('through_step')!r})")
    files = data.get("files")
    if not isinstance(files, dict):
        raise TraceError(f"{path}: malformed commit marker (files is not an object)")
    total = 0
    for kind, entry in files.items():
        if kind not in EVENT_KINDS:
            raise TraceError(f"{path}: unknown event kind {kind!r}")
        if not isinstance(entry, dict) or not is_int(entry.get("rows"), 0, INT64_MAX):
            raise TraceError(f"{path}: malformed entry for {kind}")
        if entry.get("file") != segment_file(kind, index):
            raise TraceError(f"{path}: the entry for {kind} names {entry.get('file')!r}, "
                             f"expected {segment_file(kind, index)!r}")
        total += entry["rows"]
    num_events = data.get("num_events", total)
    if not is_int(num_events, total, total):
        raise TraceError(f"{path}: num_events is {num_events!r}, its files hold {total} rows")
    first, last = data.get("first_event_id"), data.get("last_event_id")
    if total == 0 and first is None and last is None:
        return
    if not (is_int(first, 0, INT64_MAX) and is_int(last, first, INT64_MAX)
            and last - first + 1 >= total):
        raise TraceError(f"{path}: malformed event id range ({first!r}..{last!r}) "
                         f"for {total} events")


def check_profile_rows(path: Path, data: dict[str, Any]) -> None:
    """Raise ``TraceError`` unless a device profile's (``replayllm profile``) ``key`` is an
    object and its ``rows`` a list of timed steps: each a calibration row (the same fields,
    the same bounds) with a string ``label``, and the point's fields (``PROFILE_OPTIONAL_INTS``,
    ``eager``) where present of their type. ``engine.profiling.load_profile`` calls it: every
    reader of a profile gets it checked."""
    key = data.get("key")
    if key is not None and not isinstance(key, dict):
        raise TraceError(f"{path}: key must be a JSON object, got {type(key).__name__}")
    rows = data.get("rows")
    if rows is None:
        return  # the loader says "no timed steps"
    if not isinstance(rows, list) or len(rows) > MAX_HEADER_LIST:
        raise TraceError(f"{path}: rows must be a list of at most {MAX_HEADER_LIST} steps")
    for i, row in enumerate(rows):
        _check_calibration_row(path, i, row, "profile row")
        if not isinstance(row.get("label"), str):
            raise TraceError(f"{path}: profile row {i}: label must be a string, "
                             f"got {row.get('label')!r}")
        for key in PROFILE_OPTIONAL_INTS:
            if row.get(key) is not None and not is_int(row[key], 0, INT64_MAX):
                raise TraceError(f"{path}: profile row {i}: {key} must be an integer >= 0, "
                                 f"got {row[key]!r}")
        if row.get("eager") is not None and not isinstance(row["eager"], bool):
            raise TraceError(f"{path}: profile row {i}: eager must be true or false, "
                             f"got {row['eager']!r}")


def check_summary(path: Path, summary: dict[str, Any], committed: int,
                  version: int | None = None) -> None:
    """Raise ``TraceError`` unless ``summary.json``'s segment count is the committed one and its
    ``schema_version`` the header's (``version``). A clean close writes the summary after its
    last segment is committed, so a difference is a commit marker deleted (or one added) since:
    never read as a shorter, "incomplete" trace; the recorder writes one version into both."""
    stated = summary.get("schema_version")
    if version is not None and stated is not None and stated != version:
        raise TraceError(f"{path}: schema_version {stated!r}, but run.json says {version!r}; "
                         "one of them was edited")
    expected = summary.get("segments")
    if expected is None:
        return
    if not is_int(expected, 0, INT64_MAX):
        raise TraceError(f"{path}: segments must be an integer >= 0, got {expected!r}")
    if expected != committed:
        raise TraceError(f"{path}: the recording closed with {expected} committed segments, "
                         f"but {committed} have a commit marker; a marker was deleted or added")


def check_summary_figures(path: Path, summary: dict[str, Any], last_step: int,
                          counts: dict[str, int]) -> None:
    """Raise ``TraceError`` unless ``summary.json``'s own record of the commits (``last_step``,
    ``num_events``, ``counts`` per kind), where it has one, is the commit markers' (``last_step``:
    the last ``through_step``; ``counts``: their rows per kind). The recorder writes these from
    the markers it committed, so a difference is a summary copied from another trace (whose
    figures ``inspect`` would print as this run's: its wall time, its throughput)."""
    expected = {"last_step": last_step, "num_events": sum(counts.values())}
    for key, want in expected.items():
        got = summary.get(key)
        if got is not None and got != want:
            raise TraceError(f"{path}: {key} is {got!r}, but the commit markers say {want}: a "
                             "summary of another trace, or an edited one")
    stated = summary.get("counts")
    if stated is None:
        return
    if not isinstance(stated, dict):
        raise TraceError(f"{path}: counts must be a JSON object, got {type(stated).__name__}")
    for kind in EVENT_KINDS:
        got = stated.get(kind, 0)
        if got != counts.get(kind, 0):
            raise TraceError(f"{path}: counts.{kind} is {got!r}, but the commit markers hold "
                             f"{counts.get(kind, 0)} rows: a summary of another trace, or an "
                             "edited one")
