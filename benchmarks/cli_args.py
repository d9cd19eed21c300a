"""Argument types for the benchmarks' own parsers (``python -m benchmarks.NAME``), so an odd
option is argparse's one line and exit 2, as through ``replayllm bench``, not a traceback
mid-run, and ``--json`` never writes over a file replayllm did not write as a result."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """An integer >= 1 (``--repeat 0`` was an AssertionError after the first mode ran)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def milliseconds(text: str) -> float:
    """A finite number >= 0 (``--step-ms -1`` or ``nan`` failed in ``time.sleep``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def json_out(text: str) -> str:
    """``--json``: a new file or an earlier JSON result (``replay.cli.paths.check_bench_json``,
    as ``replayllm bench --json`` checks it): it was opened for writing whatever it named."""
    from engine.errors import ReplayLLMError
    from replay.cli.paths import check_bench_json
    from tracing.errors import TraceError

    if not text:
        raise argparse.ArgumentTypeError("an empty file name")
    try:
        check_bench_json(text)
    except (ReplayLLMError, TraceError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
