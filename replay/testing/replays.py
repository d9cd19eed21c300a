"""``assert_replays``: a trace still replays identically, and every invariant holds over it."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from engine.errors import ReplayLLMError
from engine.policy import policy_change_note
from tracing.errors import TraceError, one_line


class IncompleteTraceWarning(UserWarning):
    """``assert_replays`` passed a killed recording: only its committed steps were checked."""


class ReplayMismatch(AssertionError):
    """A trace no longer verifies (or breaks an invariant): the message is the report."""


def assert_replays(trace_dir: str | Path, invariants: bool = True) -> Any:
    """Verify the trace at ``trace_dir`` (``replay.verify.verify``) and, with ``invariants``,
    check its events (``check_trace``); raise ``ReplayMismatch`` with the report otherwise.

    Returns the ``VerifyResult``. A note says when the recorded user policy's source changed;
    a replay the engine refuses (a ``PolicyError``: the recorded policy raises or cannot be
    loaded, as when a recording stopped at its error) is a mismatch naming why, and so is a
    directory that is no readable trace (a ``TraceError``: a damaged or foreign ``run.json``, a
    recording killed before its first step was committed), in one line. A recording killed
    later passes on what it committed, with an ``IncompleteTraceWarning`` saying so.
    """
    from replay.testing.invariants import check_trace
    from replay.verify import verify
    from tracing.reader import read_trace

    try:
        trace = read_trace(trace_dir)
    except TraceError as exc:
        raise ReplayMismatch(f"cannot read the trace: {one_line(exc)}") from exc
    note = policy_change_note(dict(trace.header))
    try:
        result = verify(trace)
    except (ReplayLLMError, TraceError) as exc:
        cause = f"cannot replay: {one_line(exc).removeprefix(f'{trace_dir}: ')}"
        raise ReplayMismatch(f"{trace_dir}: {note}\n{cause}" if note else f"{trace_dir}: {cause}") \
            from exc
    if not result.identical:
        text = result.report()
        raise ReplayMismatch(f"{trace_dir}: {note}\n{text}" if note else f"{trace_dir}: {text}")
    if invariants:
        report = check_trace(trace)
        if not report.ok:
            raise ReplayMismatch(f"{trace_dir}: {report.report()}")
    if not trace.complete:
        stopped = trace.unread_note or ("the recording stopped; committed through step "
                                        f"{trace.last_step}")
        warnings.warn(IncompleteTraceWarning(
            f"{trace_dir} is incomplete ({stopped}): only what it read was replayed and "
            "checked"), stacklevel=2)
    return result
