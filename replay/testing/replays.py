"""``assert_replays``: a trace still replays identically, and every invariant holds over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.policy import policy_change_note


class ReplayMismatch(AssertionError):
    """A trace no longer verifies (or breaks an invariant): the message is the report."""


def assert_replays(trace_dir: str | Path, invariants: bool = True) -> Any:
    """Verify the trace at ``trace_dir`` (``replay.verify.verify``) and, with ``invariants``,
    check its events (``check_trace``); raise ``ReplayMismatch`` with the report otherwise.

    Returns the ``VerifyResult``. A note says when the recorded user policy's source changed.
    """
    from replay.testing.invariants import check_trace
    from replay.verify import verify
    from tracing.reader import read_trace

    trace = read_trace(trace_dir)
    note = policy_change_note(dict(trace.header))
    result = verify(trace)
    if not result.identical:
        text = result.report()
        raise ReplayMismatch(f"{trace_dir}: {note}\n{text}" if note else f"{trace_dir}: {text}")
    if invariants:
        report = check_trace(trace)
        if not report.ok:
            raise ReplayMismatch(f"{trace_dir}: {report.report()}")
    return result
