"""``replayllm whatif --workload FILE --stream``: simulate a large workload file in bounded memory.

The requests are read as the simulated clock reaches their arrival and forgotten when they
finish (``replay.whatif.stream``); ``--trace-out DIR`` also writes the simulated events there as
a trace, in segments. Variants run one after another, each reading the file again, each with
a progress bar on stderr (requests finished of the file's; only when stderr is a terminal).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from engine.config import AUTO_SIZED_BLOCKS, Config
from engine.errors import InvalidRequestError, ReplayLLMError
from replay.cli.progress import progress_wanted
from replay.cli.variants import check_some_ran

# Plots draw every step (1.2 M for 200,000 requests: 7 s and 0.8 GB in matplotlib), which the
# bounded memory of --stream cannot afford: said, not skipped in silence.
NO_PLOTS_NOTE = ("note: --stream draws no plots (every step of the run would be held to draw "
                 "them): steps.parquet and requests.parquet have the figures; --no-plots "
                 "drops this note")


def run_streamed(args: argparse.Namespace, variants: list[tuple[str, dict[str, Any]]],
                 timing: Any, finish: Any, row: Any) -> int:
    """Stream ``args.workload`` through each variant, print the table, write the outputs.

    ``timing``: loads (cost model, Config) from ``--timing-from`` (with ``args``' ``--profile``,
    ``--cost-option`` and ``--host-from``, as without streaming); ``finish`` and ``row`` are
    the whatif command's output writer and table row (one format for both paths)."""
    from replay.whatif.report import variants_table
    from replay.whatif.stream import WorkloadSource, simulate_stream

    if args.trace is not None or args.workload in (None, "bench") or args.compare:
        raise ReplayLLMError("--stream and --trace-out take --workload FILE (no trace, no "
                             "--compare)")
    if args.num_seqs is not None:
        raise ReplayLLMError("--num-seqs does not apply to --stream (cut the file instead)")
    if args.trace_out and len(variants) > 1:
        raise ReplayLLMError("--trace-out writes one variant's trace: drop --grid")
    if args.trace_out:
        check_trace_out(args.trace_out, args.out)
    cost, config = timing(args.timing_from, args) if args.timing_from else (None, None)
    config = config or Config()
    if cost is None:
        print("note: no step-time model (--timing-from TRACE): decisions only, no times; "
              "every request joins at once")
    if config.num_kvcache_blocks == AUTO_SIZED_BLOCKS and not all(
            "num_kvcache_blocks" in v for _, v in variants):
        raise ReplayLLMError("the KV pool size is unknown without a trace: --set "
                             "num_kvcache_blocks=N (or --timing-from a trace)")
    check_regular_file(args.workload)
    check_first_request(args.workload)
    total = count_requests(args.workload) if progress_wanted() else None
    rows, results = [], []
    for name, overrides in variants:
        source = WorkloadSource(checked_requests(args.workload), config, name=str(args.workload))
        with progress_bar(name, total) as progress:
            result = simulate_stream(source, overrides, cost, name, trace_out=args.trace_out,
                                     progress=progress)
        for note in result.notes:
            print(f"note ({result.name}): {note}")
        rows.append(row(result))
        results.append(result)
    print(variants_table(rows))
    lines = [] if args.no_plots else [NO_PLOTS_NOTE]
    for line in lines:
        print(line)
    finish(args, rows, cost, None, None, lines)  # lines: in the --report page too
    check_some_ran(results)  # as without --stream: exit 2 where none could run
    return 0


def check_trace_out(trace_out: str, out: str) -> None:
    """Before the work: ``--trace-out`` and ``--out`` are two directories, neither inside the
    other (the outputs were refused only once the whole simulation had run, and lost), and
    ``--trace-out`` replaces no recording (``stream.trace_out_replaces``)."""
    from pathlib import Path

    from replay.whatif.stream import trace_out_replaces

    trace, results = Path(trace_out).resolve(), Path(out).resolve()
    if trace == results or results in trace.parents or trace in results.parents:
        raise ReplayLLMError(f"--trace-out {trace_out} and --out {out} must be two directories, "
                             "neither inside the other")
    trace_out_replaces(trace_out)


def check_regular_file(workload: str) -> None:
    """Refuse a pipe or other non-seekable source: --stream reads the file once to check it and
    once per variant, and a pipe's second read is empty (it simulated 0 requests, exit 0)."""
    import os
    import stat

    try:
        mode = os.stat(workload).st_mode
    except OSError:
        return  # the reader's own error names it
    if not stat.S_ISREG(mode):
        raise ReplayLLMError(
            f"{workload}: --stream reads the workload more than once, so it must be a regular "
            "file, not a pipe (a .gz file is read as it is; without --stream a pipe is read once)")


def check_first_request(workload: str) -> None:
    """An empty file is refused, as without ``--stream`` (it wrote results of no request and
    exited 0); only the first request is read."""
    from replay.workloads.store import read_workload

    if next(iter(read_workload(workload)), None) is None:
        raise InvalidRequestError(f"{workload}: the workload holds no requests")


def checked_requests(workload: str) -> Iterator[Any]:
    """``workload``'s requests, each held to the rule a run's and a plain what-if's are
    (``replay.workloads.fields.check_request``)."""
    from replay.workloads.fields import check_request
    from replay.workloads.store import read_workload

    for index, request in enumerate(read_workload(workload)):
        check_request(request, f"{workload}: request {index}")
        yield request


@contextlib.contextmanager
def progress_bar(name: str, total: int | None) -> Iterator[Callable[[int], None] | None]:
    """A tqdm bar of one variant's finished requests, on stderr, as ``replayllm run`` draws
    one: ``simulate_stream``'s ``progress`` (called each ``PROGRESS_EVERY`` requests, tqdm
    redrawing at most twice a second), or None when ``progress_wanted()`` says no."""
    if not progress_wanted():
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=name, unit=" req", dynamic_ncols=True, mininterval=0.5,
               file=sys.stderr)

    def progress(finished: int) -> None:
        bar.update(finished - bar.n)

    try:
        yield progress
    finally:
        bar.close()  # also when stopped: no redraw after the caller's last line


def count_requests(workload: str) -> int | None:
    """The requests in ``workload``, for the bar's total: a Parquet file's row count (its
    footer), a JSONL file's non-blank lines but its header (``read_metadata``; one pass, no
    parsing); None if it cannot be read (reading it for the run then says why)."""
    from replay.workloads.store import is_parquet, read_metadata
    from replay.workloads.text_input import open_text

    try:
        if is_parquet(workload):
            import pyarrow.parquet as pq

            return pq.ParquetFile(workload).metadata.num_rows
        with open_text(workload) as handle:
            count = sum(1 for line in handle if line.strip())
        return count - bool(read_metadata(workload))
    except Exception:  # noqa: BLE001 (a bar without a total, never a failed run)
        return None
