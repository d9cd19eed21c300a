"""``replayllm tune``: search the configuration space for the highest goodput meeting SLOs.

    replayllm tune traces/h200-reference --slo ttft_p99=0.5 --slo tpot_p50=0.0055
    replayllm tune --workload FILE --timing-from TRACE --slo ttft_p99=1 --space max_num_seqs=64,128

``replay.cli.main`` wires it in with ``add_parser(subparsers)`` and ``run(args)``.
Every user error is a ``ReplayLLMError``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.config import AUTO_SIZED_BLOCKS
from replay.cli.paths import check_out_dir, check_report
from replay.cli.variants import WhatifError, parse_grid
from replay.cli.whatif_sources import load, source_workload
from replay.whatif import run_outputs
from replay.whatif.executors import EXECUTORS, variant_runner
from replay.whatif.tune import DEFAULT_BUDGET, DEFAULT_ETA, default_space, parse_slos, tune
from tracing.outdir import TUNE, staged_dir

DEFAULT_OUT = "out/tune"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``tune`` subcommand to ``replayllm``'s subparsers."""
    p = subparsers.add_parser(
        "tune",
        help="search settings for the highest goodput that meets latency SLOs",
        description="Simulate configurations of a trace's (or a workload's) requests and report "
        "the highest goodput meeting every --slo, the Pareto front and the best --set lines.",
    )
    p.add_argument("trace", nargs="?", help="trace directory whose workload is re-run")
    p.add_argument("--workload",
                   help="instead of a trace: 'bench' or a workload file (JSONL or Parquet)")
    p.add_argument("--num-seqs", type=int, help="with --workload: only the first N requests")
    p.add_argument("--timing-from", metavar="TRACE|MODEL.json",
                   help="fit step times on this trace (or load a saved model) instead")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC=SECONDS",
                   help="an upper bound, e.g. --slo ttft_p99=0.5 --slo tpot_p50=0.02")
    p.add_argument("--space", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="values searched for a Config field (default: a space around the "
                   "source's settings over max_num_seqs, max_num_batched_tokens, "
                   "num_kvcache_blocks, policy, enable_prefix_caching)")
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                   help="most configurations run on the whole workload; a larger space is "
                   f"narrowed by successive halving on request subsets (default {DEFAULT_BUDGET})")
    p.add_argument("--eta", type=int, default=DEFAULT_ETA,
                   help=f"successive halving keeps 1/eta per rung (default {DEFAULT_ETA})")
    p.add_argument("--executor", choices=EXECUTORS, default="process",
                   help="where variants run: local processes, or Ray (RAY_ADDRESS or local)")
    p.add_argument("--jobs", type=int, default=None, help="parallel processes (default: cores)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plot")
    p.add_argument("--report", metavar="FILE.html",
                   help="also write one self-contained HTML page (tables and plot inline)")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``tune`` from parsed arguments; returns the exit status (0, or 1: nothing meets)."""
    if (args.trace is None) == (args.workload is None):
        raise WhatifError("give a TRACE or --workload bench|FILE (exactly one)")
    if args.jobs is not None and args.jobs < 1:
        raise WhatifError(f"--jobs must be >= 1, got {args.jobs}")
    slos = list(parse_slos(args.slo))
    space = parse_grid(args.space, option="--space")
    check_out_dir(args.out, TUNE)  # before the search, not after it
    check_report(args.report, args.out)
    # A space setting the policy (--space policy=...) needs no recorded user policy's module.
    # (--timing-from's too, with --workload: its Config is the variants' base.)
    workload, cost, notes, timing = load(args, source_workload(
        args, policy_needed="policy" not in space), policy_set="policy" in space)
    for note in [*notes, *timing]:
        print(f"note: {note}")
    if cost is None:
        raise WhatifError("tune needs step times: a trace with measured steps, or --timing-from")
    if workload.config.num_kvcache_blocks == AUTO_SIZED_BLOCKS and (
        "num_kvcache_blocks" not in space
    ):
        raise WhatifError("the KV pool size is unknown without a trace: --space "
                          "num_kvcache_blocks=N,... (or --timing-from a trace)")
    space = {**default_space(workload), **space} if not space else space
    runner = variant_runner(args.executor, cost, args.jobs)
    result = tune(workload, slos, space, runner, budget=args.budget, eta=args.eta)
    from replay.whatif import tune_report

    print(tune_report.describe_search(result))
    print(tune_report.table(result))
    with staged_dir(args.out, TUNE, "tune", force=True) as stage:  # written whole or not at all
        written = tune_report.write_outputs(result, stage)
        if not args.no_plots:
            written.append(tune_report.write_pareto_plot(result, stage / "pareto.png"))
        # The page's plot is read here, before the rename: --out is then the next writer's.
        pngs = run_outputs.read_plots(written) if args.report else {}
    written = [Path(args.out) / p.name for p in written]
    print(f"wrote {', '.join(p.name for p in written)} to {args.out}")
    slo_text = ", ".join(str(s) for s in slos)
    base = result.baseline
    as_recorded = (f"as recorded: {base.result.status}" if not base.result.ok else
                   f"as recorded: rejects {base.result.newly_rejected} of {base.requests} "
                   "requests" if base.result.newly_rejected else
                   f"as recorded: {'meets' if base.meets else 'misses'} {slo_text}")
    print(as_recorded)
    best = result.best
    lines = [tune_report.describe_search(result), tune_report.table(result), as_recorded]
    if best is None:
        lines.append(f"no configuration searched meets {slo_text}")
        lines += tune_report.verdict(result)
    else:
        lines.append(f"best: {best.name} (goodput {tune_report.rate(best.goodput_req_s)} "
                     "req/s)")
        lines += result.set_lines() or ["(the source's own settings)"]
    for line in lines[3:]:
        print(line)
    if args.report:
        import pandas as pd

        frame = pd.DataFrame(tune_report.rows(result))
        page = run_outputs.write_page(args.report, "replayllm tune", lines,
                                      [("configurations", frame)], pngs)
        print(f"wrote {page}")
    return 0 if best is not None else 1

