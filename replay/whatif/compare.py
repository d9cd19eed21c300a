"""What ``whatif --compare`` sets side by side: a prediction and the recording it predicts.

The recording must hold the prediction's workload (``check_same_workload``). When it is
complete, every figure of both runs is compared. When it is incomplete (a killed run: no
``summary.json``), its figures cover only the steps it committed: some requests finished there,
the rest were still queued or running, while the prediction runs the whole workload to its end.
Set side by side as they are, the two differ by what the recording lost, not by any error of
the prediction (a makespan "off by +250%"). So ``RecordedScope`` restricts both sides alike:

- the requests compared are those the recording finished (matched by ``seq_id``, as the
  decision comparison matches them); per-request figures (TTFT, TPOT, e2e, queue), completion
  tokens and preemptions are theirs only;
- each side's run is cut at the step where the last of those requests finished, so the step
  figures (steps, makespan, throughput, batch size, KV blocks, prefix hit rate) cover the same
  stretch of the run on both sides (the same steps, when the decisions agree);
- the decision streams are compared over the steps the recording committed.

A recording that finished no request leaves nothing to compare: ``load_other`` raises
``ReplayLLMError`` (one line, exit 2) before any step-time model is fitted, instead of printing a
table of nothing.

Plain ``whatif SOURCE`` follows the same rule when SOURCE itself is incomplete
(``incomplete_source``): its "recorded" row and every predicted row cover the requests the
recording finished, each run cut at the step that finished the last of them
(``SimWorkload.scope``, applied by ``run_variant``); one that finished none has no recorded row.
So does ``whatif SOURCE --compare LOADGEN_RESULT`` (``restricts``): its recorded and predicted
rows as plain whatif's, and its client row the result's rows of those same requests
(``scope_client``); a SOURCE that finished none leaves nothing to compare (refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ReplayLLMError
from replay.recorded import RecordedEvents, keep_rows

# Event kinds whose rows belong to one request and feed its per-request figures.
PER_REQUEST_KINDS = ("request_added", "seq_scheduled", "token_sampled", "request_finished",
                     "preempted")


def check_same_workload(workload: Any, other: RecordedEvents, other_name: str) -> None:
    """Raise ``ReplayLLMError`` unless ``other`` recorded ``workload``'s requests (prompt
    lengths and max_tokens, in order); an incomplete recording may hold only the first ones."""
    added = other.tables["request_added"]
    ours = [(len(r.prompt), r.params.max_tokens) for r in workload.requests]
    theirs = list(zip(np.asarray(added["prompt_len"]).tolist(),
                      np.asarray(added["max_tokens"]).tolist()))
    same = ours == theirs if other.complete else ours[:len(theirs)] == theirs
    source = getattr(workload, "recorded", None)
    if not same and source is not None and not source.complete and ours == theirs[:len(ours)]:
        raise ReplayLLMError(
            f"{workload.name} is incomplete ({_stopped(source)}): it recorded only {len(ours)} of "
            f"the {len(theirs)} requests {other_name} ran; --compare needs a source holding them "
            "all (a complete recording)"
        )
    if not same:
        raise ReplayLLMError(
            f"{other_name} ran another workload than {workload.name} ({len(theirs)} vs "
            f"{len(ours)} requests, or other prompt lengths / max_tokens); --compare needs the "
            "same requests"
        )


def abort_note(workload: Any, other: RecordedEvents, other_name: str) -> str | None:
    """A note where ``other`` aborted other requests than ``workload`` (by their place in the
    workload): the prediction replays the source's aborts, not OTHER's, so their decision
    streams part at the first abort one of them has and the other lacks (the workload check
    compares prompt lengths and max_tokens only)."""
    added, finished = other.tables["request_added"], other.tables["request_finished"]
    place = {seq: i for i, seq in enumerate(np.asarray(added["seq_id"]).tolist())}
    theirs = {place[seq] for seq, reason in zip(np.asarray(finished["seq_id"]).tolist(),
                                                np.asarray(finished["reason"]).tolist())
              if reason == "aborted" and seq in place}
    ours = {index for _, _, index in workload.aborts}
    if theirs == ours:
        return None
    return (f"{other_name} aborted {len(theirs)} requests, {workload.name} {len(ours)} "
            f"({len(theirs ^ ours)} differ): the prediction replays {workload.name}'s aborts, "
            "so the decisions part where they differ")


@dataclass(frozen=True)
class RecordedScope:
    """The requests an incomplete recording finished, out of the workload's ``total``."""

    name: str
    seq_ids: np.ndarray
    total: int
    last_step: int
    unread_note: str | None = None  # ``RecordedEvents.unread_note``

    @property
    def finished(self) -> int:
        return len(self.seq_ids)

    def warning(self) -> str:
        """The line ``--compare`` prints before its table."""
        return (f"{self.name} is incomplete ({_stopped(self)}): it finished {self.finished} of "
                f"the {self.total} requests; comparing only those {self.finished}, each run up "
                "to the step that finished the last of them")

    def source_warning(self) -> str:
        """The line plain ``whatif`` prints for an incomplete SOURCE."""
        return (f"{self.name} is incomplete ({_stopped(self)}): it finished {self.finished} of "
                f"the {self.total} requests it recorded; the recorded row and every prediction "
                f"cover only those {self.finished}, each run up to the step that finished the "
                "last of them")

    def note(self) -> str:
        """The same, for the ``notes`` column of summary.parquet."""
        return (f"compared over the {self.finished} of {self.total} requests the incomplete "
                f"recording {self.name} finished")

    def restrict(self, events: RecordedEvents) -> RecordedEvents:
        """``events`` through the step where the last of the scope's requests finished, with
        the per-request rows of those requests only (see the module's docstring)."""
        finished = events.tables["request_finished"]
        mine = np.isin(np.asarray(finished["seq_id"], dtype=np.int64), self.seq_ids)
        steps = np.asarray(finished["step"], dtype=np.int64)[mine]
        last = int(steps.max()) if len(steps) else -1
        tables = {}
        for kind, cols in events.tables.items():
            keep = np.asarray(cols["step"], dtype=np.int64) <= last
            if kind in PER_REQUEST_KINDS:
                keep &= np.isin(np.asarray(cols["seq_id"], dtype=np.int64), self.seq_ids)
            tables[kind] = keep_rows(cols, keep)
        return RecordedEvents(events.header, tables, last, events.complete, events.unread_note)


def _stopped(events: Any) -> str:
    """Where an incomplete recording stopped, in words; for a copy taken while it was being
    recorded, which committed segments the reader left unread (``Trace.unread_note``)."""
    note = getattr(events, "unread_note", None)
    if note:
        return note
    return ("the recording stopped; committed no step" if events.last_step < 0
            else f"the recording stopped; committed through step {events.last_step}")


def _finished_ids(events: RecordedEvents) -> np.ndarray:
    return np.unique(np.asarray(events.tables["request_finished"]["seq_id"], dtype=np.int64))


def _nothing_to_compare(name: str, stopped: str, total: int) -> ReplayLLMError:
    return ReplayLLMError(f"{name} is incomplete ({stopped}) and finished none of the {total} "
                          "requests: nothing to compare")


def scope_of(other: RecordedEvents, total: int, other_name: str) -> RecordedScope | None:
    """None for a complete recording (everything is compared); for an incomplete one, the
    requests it finished. Raises ``ReplayLLMError`` when it finished none."""
    if other.complete:
        return None
    seq_ids = _finished_ids(other)
    if not len(seq_ids):
        raise _nothing_to_compare(other_name, _stopped(other), total)
    return RecordedScope(other_name, seq_ids, total, int(other.last_step), other.unread_note)


def load_other(workload: Any, path: str | None
               ) -> tuple[RecordedEvents, RecordedScope | None] | None:
    """``--compare OTHER_TRACE``'s recording and its scope (``scope_of``), after
    ``target_config`` and ``check_same_workload``: every refusal here comes before any
    step-time model is fitted.
    A killed OTHER that finished nothing is refused from its commit markers alone. None without
    ``--compare``, without a TRACE, or for a loadgen result."""
    if path is None or workload is None:
        return None
    # Only with --compare: the loadgen reader brings the HTTP client's imports (~0.3 s).
    from replay.loadgen.result import is_result
    from replay.recorded import from_trace
    from tracing.reader import read_trace

    if is_result(path):
        return None
    if Path(path).is_file():  # neither kind --compare takes: say both
        raise ReplayLLMError(f"{path}: neither a trace (a directory holding run.json) nor a "
                             "loadgen result (a Parquet file `replayllm loadgen` wrote)")
    trace = read_trace(path)
    target_config(trace.header, path)
    if not trace.complete and not trace.counts()["request_finished"]:
        raise _nothing_to_compare(path, _stopped(trace), len(workload.requests))
    other = from_trace(trace)
    check_same_workload(workload, other, path)
    return other, scope_of(other, len(workload.requests), path)


def target_config(header: dict[str, Any], path: str) -> Any:
    """The Config ``--compare OTHER_TRACE``'s prediction runs: OTHER's, read before any
    step-time model is fitted (it was built only after the fitting, a slow one on a long trace,
    and then failed). OTHER's user policy must be importable here: the prediction runs it. The
    source's and ``--timing-from``'s need not be (the prediction sets OTHER's policy; step
    times never need one)."""
    from engine.errors import ConfigError
    from engine.policy import is_import_path, policy_class
    from replay.replayer import config_from_header

    policy = str((header.get("config") or {}).get("policy", ""))
    if is_import_path(policy):
        try:
            policy_class(policy)
        except ConfigError as exc:
            raise ReplayLLMError(
                f"{path} was recorded with the user policy {policy}, which cannot be imported "
                f"here ({exc}); --compare predicts its run under that policy, so put the "
                "policy's package on PYTHONPATH") from None
    return config_from_header(header)


def incomplete_source(workload: Any, restrict: bool) -> str | None:
    """The warning for an incomplete SOURCE (None for a complete one or no recording). With
    ``restrict`` (plain ``whatif``: predictions set beside the recording), also sets
    ``workload.scope`` to the requests it finished, so that ``run_variant`` and
    ``recorded_events`` cover those only. A recording of no request, killed before it recorded
    one or complete (an ``LLM`` opened and closed), is refused (``ReplayLLMError``): there is
    nothing to re-run (whatif and tune ran zero requests), as an empty workload file is."""
    recorded = workload.recorded
    if recorded is None:
        return None
    total = len(workload.requests)
    if not total:
        state = "" if recorded.complete else f"is incomplete ({_stopped(recorded)}) and "
        raise ReplayLLMError(f"{workload.name} {state}recorded no request: nothing to re-run")
    if recorded.complete:
        return None
    if not restrict:
        return (f"{workload.name} is incomplete ({_stopped(recorded)}): its workload is only "
                f"the {total} requests it recorded")
    seq_ids = _finished_ids(recorded)
    if not len(seq_ids):
        return (f"{workload.name} is incomplete ({_stopped(recorded)}) and finished none of the "
                f"{total} requests it recorded: no recorded row to compare; each prediction "
                "runs them all to the end")
    workload.scope = RecordedScope(workload.name, seq_ids, total, int(recorded.last_step),
                                   recorded.unread_note)
    return workload.scope.source_warning()


def restricts(compare: str | None) -> bool:
    """Whether ``incomplete_source`` restricts an incomplete SOURCE to the requests it finished:
    for plain whatif and ``--compare LOADGEN_RESULT``, not ``--compare OTHER_TRACE`` (whose own
    scope, ``load_other``'s, applies)."""
    if not compare:
        return True
    from replay.loadgen.result import is_result  # only with --compare: the HTTP client's imports

    return is_result(compare)


def scope_client(frame: Any, summary: dict[str, float], workload: Any, name: str,
                 partial: bool = False) -> tuple[Any, dict[str, float], int, list[str]]:
    """A loadgen result (``name``) restricted as an incomplete SOURCE's recorded and predicted
    rows are (``incomplete_source``): the rows of the requests the recording finished, matched by
    prompt length and max_tokens in workload order (``_match_client_rows``), summarized anew
    (its makespan up to the last of them); and
    how many requests the other rows cover, and a line saying so. Unchanged for a complete
    SOURCE. Raises ``ReplayLLMError`` where nothing can be set side by side: a SOURCE that
    finished none, a result holding none of them, or one lacking any of them (another workload;
    a ``partial`` result, cut by Ctrl-C, may lack some)."""
    from replay.loadgen.result import summarize

    recorded, scope = workload.recorded, getattr(workload, "scope", None)
    if recorded is None or recorded.complete:
        return frame, summary, len(workload.requests), []
    if scope is None:
        raise _nothing_to_compare(workload.name, _stopped(recorded), len(workload.requests))
    added = recorded.tables["request_added"]
    finished = np.isin(np.asarray(added["seq_id"], dtype=np.int64), scope.seq_ids)
    rows = _match_client_rows(frame, added, finished)
    kept = frame.loc[[row for row, done in zip(rows, finished) if done and row is not None]]
    if len(kept) < scope.finished and (not partial or not len(kept)) and len(frame):
        raise ReplayLLMError(
            f"{name} ran another workload than {workload.name} ({scope.finished - len(kept)} of "
            f"the {scope.finished} requests the incomplete recording finished have no request "
            "of their prompt length and max_tokens there): its rows cannot be matched to the "
            f"{scope.finished} requests it finished")
    if not len(kept):
        raise ReplayLLMError(f"{name} holds none of the {scope.finished} requests the "
                             f"incomplete recording {workload.name} finished: nothing to compare")
    kept = kept.sort_values("index")
    line = (f"note: the client row covers the {len(kept)} of those {scope.finished} requests "
            f"{name} holds (matched by prompt length and max_tokens in workload order), up to the "
            "last of them")
    return (kept, summarize(kept, summary.get("makespan_s", float("nan"))), scope.finished,
            [line])


def _match_client_rows(frame: Any, added: dict[str, Any], finished: np.ndarray
                       ) -> list[Any]:
    """The client row (a label of ``frame``, or None where it holds none) of each request the
    recording added, in ``seq_id`` order.

    The engine numbers requests in the order they reach it, which is not the workload's
    (``index``) where a later request's body is sent or parsed first. So a row is matched by
    its shape, its prompt tokens and max_tokens: the k-th recorded request of a shape gets the
    k-th row of that shape by index. Where that matches fewer ``finished`` requests than
    max_tokens alone (a result whose prompt counts are not the server's), max_tokens alone."""
    theirs = list(zip(np.asarray(frame["prompt_tokens"]).tolist(),
                      np.asarray(frame["max_tokens"]).tolist()))
    order = np.argsort(np.asarray(frame["index"]), kind="stable")
    ours = list(zip(np.asarray(added["prompt_len"]).tolist(),
                    np.asarray(added["max_tokens"]).tolist()))
    best: list[Any] = []
    for shape in ((lambda k: (int(k[0]), int(k[1]))), (lambda k: int(k[1]))):
        rows: dict[Any, list[Any]] = {}
        for i in order:
            rows.setdefault(shape(theirs[i]), []).append(frame.index[i])
        queues = {key: iter(found) for key, found in rows.items()}
        matched = [next(queues.get(shape(key), iter(())), None) for key in ours]
        if not best or _count(matched, finished) > _count(best, finished):
            best = matched
    return best


def _count(rows: list[Any], finished: np.ndarray) -> int:
    return sum(1 for row, done in zip(rows, finished) if done and row is not None)


def recorded_events(workload: Any) -> RecordedEvents | None:
    """What the "recorded" row of plain ``whatif`` shows: the whole recording, its scope
    (``incomplete_source``), or None (no recording, or an incomplete one that finished
    nothing)."""
    recorded, scope = workload.recorded, getattr(workload, "scope", None)
    if recorded is None or (not recorded.complete and scope is None):
        return None
    return recorded if scope is None else scope.restrict(recorded)


def note_scope(rows: list[dict[str, Any]], workload: Any) -> None:
    """Add the scope's note (if any) to each row's ``notes`` (summary.parquet)."""
    scope = getattr(workload, "scope", None)
    if scope is not None:
        for row in rows:
            row["notes"] = [*(row.get("notes") or []), scope.note()]


def client_view(frame: Any, summary: dict[str, float], run: dict[str, Any], name: str,
                trace_name: str, trace_requests: int) -> tuple[Any, dict[str, float], list[str]]:
    """A loadgen result as ``whatif TRACE --compare LOADGEN_RESULT`` sets it beside TRACE:
    (per-request rows, summary, lines to print and note on its row).

    A retried request's client TTFT and e2e count from its first send, the refused attempts
    and the waits included (``retry_wait_s``); the server's trace, and so the prediction, see
    only the accepted attempt. Comparing client with server, a user asks how much the network
    and the client add to what the server did, not how long the server refused: those figures
    are counted here from the accepted attempt (``retry_wait_s`` left out, ``sent_s`` moved to
    it), and a line says so. A result marked partial (Ctrl-C) holds only the requests that
    completed: a warning says the client row covers those only (its rows carry no request id
    of TRACE's to restrict the other rows to them, as ``RecordedScope`` does for a trace)."""
    from replay.loadgen.result import RETRIES, RETRY_WAIT, summarize

    lines = []
    if run.get("partial"):
        planned = run.get("requests_planned", "?")
        lines.append(f"warning: {name} is partial (loadgen was interrupted): it holds the "
                     f"{len(frame)} of the {planned} requests planned that completed; the client "
                     f"row covers those {len(frame)} only, the recorded and predicted rows all "
                     f"{trace_requests} of {trace_name}")
    elif len(frame) != trace_requests:
        lines.append(f"note: {name} sent {len(frame)} requests, {trace_name} recorded "
                     f"{trace_requests}")
    wait = frame[RETRY_WAIT].to_numpy(dtype=float)
    retried = frame[RETRIES].to_numpy() > 0
    if not retried.any():
        return frame, summary, lines
    frame = frame.assign(**{column: frame[column] + sign * wait for column, sign in
                            (("sent_s", 1), ("send_lag_s", 1), ("ttft_s", -1), ("e2e_s", -1))})
    lines.append(f"note: {int(retried.sum())} of the {len(frame)} requests in {name} were "
                 "retried (refused, or never reaching the server): their client "
                 "TTFT and e2e count from the accepted attempt, as the server's trace does "
                 f"({float(wait.sum()):.3g} s of refused attempts and waits, retry_wait_s, "
                 "left out)")
    return frame, summarize(frame, summary.get("makespan_s", float("nan"))), lines
