"""``replayllm run``: a workload on a model, recorded to a trace."""

from __future__ import annotations

import sys
from itertools import islice
from pathlib import Path
from typing import Any

from engine.errors import InvalidRequestError
from replay.cli import interrupt, progress
from replay.workloads.builtin import reference_workload
from replay.workloads.fields import check_request
from replay.workloads.request import Request
from replay.workloads.store import read_workload

# Untraced warm-up runs at most (``--warm-up``): each loads the model again and runs the whole
# workload; one compiles the kernels, the benchmark matrix uses three, and a typo
# (``--warm-up 1000``) meant hours before the traced run.
MAX_WARM_UP = 10


def load_requests(workload: str, num_seqs: int | None) -> list[Request]:
    """The requests of ``workload`` ('bench' or a JSONL or Parquet file), the first
    ``num_seqs`` of them, each held to ``replay.workloads.fields.check_request`` (no driver
    waits for ever, no trace column overflows).

    A file is streamed and reading stops after ``num_seqs`` requests (``run --num-seqs``,
    ``whatif --num-seqs``, ``loadgen --num-requests``): the first 100 of a 10-million-line
    file are read at once, and a bad line past them is not read at all. No check needs the
    rest: a request depends only on the lines before it (the header is line 1, a
    conversation's turns come in file order), and the first N are what runs.

    Raises ``InvalidRequestError`` (one line, naming the file and the request) otherwise."""
    if num_seqs is not None and num_seqs < 1:
        raise InvalidRequestError(f"--num-seqs must be >= 1, got {num_seqs}")
    if workload == "bench":
        requests = reference_workload()[:num_seqs]
    else:
        try:
            requests = list(islice(read_workload(workload), num_seqs))
        except (UnicodeDecodeError, AttributeError, OverflowError, RecursionError) as exc:
            raise InvalidRequestError(f"{workload}: not a JSONL workload "
                                      f"({type(exc).__name__})") from None
    if not requests:  # an empty file: a run would record an empty trace and exit 0
        raise InvalidRequestError(f"{workload}: the workload holds no requests")
    for index, request in enumerate(requests):
        check_request(request, f"{workload}: request {index}")
    return requests


def run_command(
    model: str | None,
    workload: str,
    out: str,
    num_seqs: int | None,
    overrides: dict[str, Any],
    warm_up: int = 0,
    force: bool = False,
) -> int:
    """Run ``workload`` ('bench' or a JSONL or Parquet path) on ``model``, recording into ``out``.

    Every input is checked before anything on disk changes: the workload, the config, ``out``
    (``tracing.recorder.check_trace_dir``), then the model loads; an old trace at ``out`` is
    replaced only when the recorder opens, after all of that.
    ``warm_up``: untraced runs of the same workload first, in this process, so the recorded run
    starts warm (no one-off kernel compilation in its first steps), as ``replayllm bench`` does."""
    from engine import LLM
    from engine.config import Config
    from replay.cli.live import run_workload
    from tracing.inspect import describe
    from tracing.reader import read_trace
    from tracing.recorder import check_trace_dir

    if not 0 <= warm_up <= MAX_WARM_UP:  # first: cheaper than reading the workload
        raise InvalidRequestError(f"--warm-up must be in [0, {MAX_WARM_UP}] (each warm-up loads "
                                  f"the model again; 1 starts the traced run warm), got {warm_up}")
    requests = load_requests(workload, num_seqs)
    Config(**overrides)  # the overrides' own rules, before the model loads
    check_trace_dir(out, force)
    with interrupt.deferred_signals():  # Ctrl-C, SIGTERM: stop between steps
        try:
            for _ in range(warm_up):
                warm = LLM(model, record_events=False, **overrides)
                try:
                    run_workload(warm, requests, use_tqdm=progress.progress_wanted(),
                                 check=interrupt.check)
                finally:
                    warm.close()
            interrupt.check()  # before the old trace at `out` is replaced
            llm = LLM(model, trace_dir=out, force=force, trace_writer="run", **overrides)
            stopped = False
            with interrupt.recording():  # a second signal: the step ends, the trace closes
                try:
                    run_workload(llm, requests, use_tqdm=progress.progress_wanted(),
                                 check=interrupt.check)
                except (interrupt.RunInterrupted, KeyboardInterrupt):
                    stopped = True
                    raise
                finally:
                    # A clean close writes the summary and the last segment; a stopped run's
                    # commits what was recorded and writes no summary (the trace stays
                    # incomplete).
                    llm.close(interrupted=stopped)
        except interrupt.RunInterrupted as stop:
            print(f"replayllm run: {stop}: {_kept(out)}", file=sys.stderr)
            return stop.exit_status
    print(describe(read_trace(out)))
    print(f"trace: {out}")
    return 0


def _kept(out: str) -> str:
    """What an interrupted run left at ``out``, in words."""
    from tracing.errors import TraceError
    from tracing.layout import HEADER_FILE
    from tracing.reader import read_trace

    if not (Path(out) / HEADER_FILE).is_file():
        return "no trace was started"
    try:
        trace = read_trace(out)
    except TraceError as exc:  # not expected: say so rather than hide it
        return f"{out} cannot be read ({exc})"
    if trace.last_step < 0:  # as replay.verify.check_verifiable tells it
        return f"{out} is an incomplete trace with no committed step"
    return (f"{out} is an incomplete trace through step {trace.last_step} "
            f"(replayllm verify {out} checks it)")
