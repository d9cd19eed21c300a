"""``replayllm whatif``: predict a workload's run under other settings, and check predictions.

    replayllm whatif TRACE --set max_num_seqs=64 --set policy=chunked
    replayllm whatif TRACE --grid num_kvcache_blocks=300,600,900 --grid max_num_seqs=64,256
    replayllm whatif TRACE --compare OTHER_TRACE       # predicted vs measured, decisions too
    replayllm whatif --workload bench --timing-from TRACE --set num_kvcache_blocks=800

``replay.cli.main`` wires it in with ``add_parser(subparsers)`` and ``run(args)``. Every user
error is a ``ReplayLLMError``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.config import AUTO_SIZED_BLOCKS
from replay.cli.progress import progress_wanted
from replay.cli.variants import (
    WhatifError,
    build_variants,
    check_model_options,
    check_some_ran,
    parse_grid,
    parse_overrides,
    profile_option,
)
from replay.cli.whatif_sources import load, load_timing_trace, source_workload
from replay.metrics import compute, has_timings
from replay.whatif import run_outputs
from replay.whatif.compare import load_other, note_scope, recorded_events
from replay.whatif.cost.model import CostModel
from replay.whatif.executors import EXECUTORS
from replay.whatif.simulate import (
    SimResult,
    SimWorkload,
    cold_start_of,
    format_overrides,
    run_variant,
)

DEFAULT_OUT = "out/whatif"
# Config fields that describe the machine or the recording, not the schedule: left out of the
# "predicting ... under" line of --compare (they are still applied).
COSMETIC_FIELDS = frozenset({"model", "trace_flush_steps", "trace_flush_seconds",
                             "trace_segment_writer", "device"})
# Cost options that change only how a --profile's rows are used.
PROFILE_OPTIONS = frozenset({"profile_mode", "profile_scale"})


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``whatif`` subcommand to ``replayllm``'s subparsers."""
    p = subparsers.add_parser(
        "whatif",
        help="predict a recorded workload's run under other settings",
        description="Re-run a trace's workload through the engine's own scheduler under other "
        "settings, with step times from a model fitted on the trace's measured steps.",
    )
    p.add_argument("trace", nargs="?", help="trace directory whose workload is re-run")
    p.add_argument("--workload",
                   help="instead of a trace: 'bench' or a workload file (JSONL or Parquet)")
    p.add_argument("--num-seqs", type=int, help="with --workload: only the first N requests")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a Config field for every variant, e.g. --set max_num_seqs=64")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="one variant per value (several --grid: every combination)")
    p.add_argument("--compare", metavar="OTHER_TRACE|LOADGEN_RESULT",
                   help="predict OTHER_TRACE's configuration and compare with its recording; "
                   "or show a loadgen result (client-measured) beside TRACE and its prediction")
    p.add_argument("--timing-from", metavar="TRACE|MODEL.json",
                   help="fit step times on this trace (or load a saved model) instead")
    p.add_argument("--profile", action="append", metavar="PROFILE.json",
                   help="a device profile (replayllm profile) pricing the steps the timing "
                   "trace did not run, its rows fitted with the trace's own steps; several, "
                   "comma-separated, are pooled point by point")
    p.add_argument("--cost-option", dest="cost_options", action="append", default=[],
                   metavar="NAME=VALUE", help="switch a step-time model mechanism, e.g. "
                   "warmup_window=off, profile_mode=blend (replay/whatif/cost/profile.py)")
    p.add_argument("--host-from", metavar="TRACE",
                   help="price host work on the machine that recorded TRACE, measured by its "
                   "start-up calibration (replay/whatif/cost/host_speed.py)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--jobs", type=int, default=None, help="parallel processes (default: cores)")
    p.add_argument("--executor", choices=EXECUTORS, default="process",
                   help="where a grid's variants run: local processes, or Ray (RAY_ADDRESS, "
                   "or a local Ray when unset); the results are the same")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--stream", action="store_true",
                   help="with --workload FILE: read requests as they arrive, keep no finished "
                   "request (bounded memory for millions of requests)")
    p.add_argument("--trace-out", metavar="DIR",
                   help="with --stream: also write the simulated events to DIR as a trace")
    p.add_argument("--report", metavar="FILE.html",
                   help="also write one self-contained HTML page (tables and plots inline)")
    return p


# --- commands -----------------------------------------------------------------------------------
def _compare(args: argparse.Namespace, workload: SimWorkload, cost: CostModel | None,
             plotter: Any, against: tuple[Any, Any]) -> int:
    """Predict OTHER_TRACE's configuration and set the prediction beside its recording. An
    incomplete recording is compared over the requests it finished only, both sides cut alike
    and the output saying so. ``against``: ``compare.load_other``'s (recording, scope)."""
    from replay.replayer import config_from_header
    from replay.verify import compare_decisions, cut_to_step, describe_divergence
    from replay.whatif.compare import abort_note
    from replay.whatif.notes import device_note
    from replay.whatif.report import comparison_rows, comparison_table

    other, scope = against
    if scope is not None:
        print(f"warning: {scope.warning()}")
    target = config_from_header(other.header).to_dict()
    base = workload.config.to_dict()
    overrides = {k: v for k, v in target.items() if base.get(k) != v}
    shown = {k: v for k, v in overrides.items() if k not in COSMETIC_FIELDS}
    print(f"predicting {args.compare} ({format_overrides(shown)}) from {workload.name}")
    cold = cold_start_of(other.header)
    if cold is not None and cost is not None and cost.warmup_s:
        print(f"note: {args.compare} started {'cold' if cold else 'warm'}: the source's one-off "
              f"first-step costs are {'charged' if cold else 'left out'}")
    result = run_variant(workload, overrides, cost, name="predicted", cold_start=cold)
    device = device_note(cost, other.header)
    aborts = abort_note(workload, other, args.compare)
    for note in result.notes + [n for n in (device, aborts) if n]:
        print(f"note: {note}")
    if not result.ok:
        print(f"predicted: {result.status}")
        return 1
    assert result.events is not None
    measured = compute(other if scope is None else scope.restrict(other), timed=has_timings(other))
    predicted = (None if scope is None  # the variant's own metrics: the whole run
                 else compute(scope.restrict(result.events), timed=result.timed))
    if cost is None or not has_timings(other):
        print("times are not compared: " + ("no step-time model" if cost is None
                                             else f"{args.compare} has no measured step times"))
    rows = comparison_rows(result.metrics if predicted is None else predicted.summary,
                           measured.summary)
    events, over = result.events, ""
    if scope is not None:  # the recording's steps only, as verify compares a killed run's
        events, over = cut_to_step(events, scope.last_step), f" (steps 0 to {scope.last_step})"
    printed = [comparison_table(rows), f"decision streams{over}: "
               + describe_divergence(compare_decisions(other, events))]
    print("\n".join(printed))
    import pandas as pd

    notes = [] if scope is None else [scope.note()]
    table_rows = [run_outputs.row("measured", "recorded", measured, notes=notes),
                  run_outputs.sim_row(result) if predicted is None else
                  run_outputs.row(result.name, "predicted", predicted,
                                  overrides=result.overrides, notes=result.notes + notes)]
    run_outputs.finish(args, table_rows, cost, plotter, {"compare": pd.DataFrame(rows)},
                       ([f"warning: {scope.warning()}"] if scope is not None else []) + printed)
    return 0


def _compare_client(args: argparse.Namespace, workload: SimWorkload, cost: CostModel | None,
                    plotter: Any, timing: list[str]) -> int:
    """TRACE as recorded, its prediction and a loadgen run's client figures in one table: retry
    waits left out, a partial result flagged, an incomplete TRACE's finished requests only.
    ``timing``: ``whatif_sources.timing_notes``, for the recorded row."""
    from replay.loadgen.result import read_result, table_row
    from replay.whatif.compare import client_view, scope_client
    from replay.whatif.report import variants_table

    frame, summary, settings = read_result(args.compare)
    if workload.recorded is None:
        raise WhatifError("--compare LOADGEN_RESULT needs a TRACE")
    frame, summary, total, scoped = scope_client(frame, summary, workload, args.compare,
                                                  partial=bool(settings.get("partial")))
    frame, summary, notes = client_view(frame, summary, settings, args.compare, workload.name,
                                        total)  # retry waits left out
    for line in scoped + notes:
        print(line)
    result = run_variant(workload, {}, cost, name="predicted")
    rows = [run_outputs.row("recorded", "recorded", compute(recorded_events(workload)),
                            notes=timing),
            run_outputs.sim_row(result),
            table_row(f"client ({settings.get('url', '?')})", summary, frame, notes)]
    note_scope(rows, workload)
    print(variants_table(rows))
    run_outputs.finish(args, rows, cost, plotter)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``whatif`` from parsed arguments; returns the exit status."""
    if (args.trace is None) == (args.workload is None):
        raise WhatifError("give a TRACE or --workload bench|FILE (exactly one)")
    args.profile, profile_notes = profile_option(args.profile)
    check_model_options(args.workload, args.timing_from, {"--profile": args.profile,
                        "--host-from": args.host_from, "--cost-option": args.cost_options})
    overrides = parse_overrides(args.overrides)
    grid = parse_grid(args.grid, overrides)
    if args.compare and (overrides or grid or args.workload):
        raise WhatifError("--compare predicts OTHER_TRACE's own configuration from TRACE; "
                          "drop --set, --grid and --workload")
    if args.jobs is not None and args.jobs < 1:
        raise WhatifError(f"--jobs must be >= 1, got {args.jobs}")
    moot = sorted({item.partition("=")[0].strip() for item in args.cost_options}
                  & PROFILE_OPTIONS)
    if moot and not args.profile:  # never without effect in silence
        raise WhatifError(f"--cost-option {', '.join(moot)} applies to a device profile: give "
                          "--profile PROFILE.json, or drop it")
    from replay.cli.paths import check_out_dir, check_profile_arg, check_report
    from tracing.outdir import WHATIF

    check_profile_arg(args.profile)
    check_out_dir(args.out, WHATIF)  # before the work, not after it
    check_report(args.report, args.out)
    for note in profile_notes:
        print(note)
    plotter = run_outputs.plotter(args)
    try:
        return _whatif(args, overrides, grid, plotter)
    finally:
        if plotter is not None:
            plotter.close()


def _whatif(args: argparse.Namespace, overrides: dict[str, Any], grid: dict[str, list[Any]],
            plotter: Any) -> int:
    variants = build_variants(overrides, grid)
    policy_set = all("policy" in v for _, v in variants)
    if args.stream or args.trace_out:
        from functools import partial

        from replay.cli.whatif_stream import run_streamed

        return run_streamed(args, variants, partial(load_timing_trace, policy_needed=not
                                                    policy_set),
                            run_outputs.finish, run_outputs.sim_row)
    from replay.whatif.compare import restricts  # --compare OTHER_TRACE runs OTHER's policy

    source = source_workload(args, restricts(args.compare) if args.compare else not policy_set)
    against = load_other(source, args.compare)  # checked before any step-time model is fitted
    workload, cost, notes, timing = load(args, source, policy_set and not args.compare)
    notes = [*notes, *timing]
    if cost is not None and cost.host is not None:
        notes = [cost.host.words(), *notes]
    for note in notes:
        print(f"note: {note}")
    if cost is not None:
        print(cost.describe())
    if args.compare:
        if against is None:
            return _compare_client(args, workload, cost, plotter, timing)
        return _compare(args, workload, cost, plotter, against)
    if workload.config.num_kvcache_blocks == AUTO_SIZED_BLOCKS and not all(
        "num_kvcache_blocks" in v for _, v in variants
    ):
        raise WhatifError("the KV pool size is unknown without a trace: --set "
                          "num_kvcache_blocks=N (or --timing-from a trace, whose pool is used)")
    results = _run_variants(workload, variants, cost, args.jobs, args.executor)
    recorded = recorded_events(workload)  # an incomplete source's finished requests only
    rows = ([] if recorded is None else [run_outputs.row(  # the note in summary.parquet too
        "recorded", "recorded", compute(recorded), notes=timing)])
    rows += [run_outputs.sim_row(r) for r in results]
    note_scope(rows, workload)
    for r in results:
        for note in r.notes:
            print(f"note ({r.name}): {note}")
    from replay.whatif.report import variants_table

    print(variants_table(rows))
    run_outputs.finish(args, rows, cost, plotter)
    check_some_ran(results)
    return 0


def _run_variants(workload: SimWorkload, variants: list, cost: CostModel | None,
                  jobs: int | None, executor: str = "process") -> list[SimResult]:
    if len(variants) == 1:
        name, overrides = variants[0]
        return [run_variant(workload, overrides, cost, name, keep_events=False)]
    from tqdm.auto import tqdm

    from replay.whatif.executors import variant_runner

    # The bar by the rule every command's follows: a log or a pipe gets no redraws.
    with tqdm(total=len(variants), desc="whatif", dynamic_ncols=True, file=sys.stderr,
              disable=not progress_wanted()) as bar:
        return variant_runner(executor, cost, jobs, progress=lambda: bar.update(1))(
            workload, variants)

