"""``replayllm loadgen``: a workload against an OpenAI-compatible server, measured on the client."""

from __future__ import annotations

import argparse

DEFAULT_OUT = "loadgen.parquet"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("loadgen", help="send a workload to an OpenAI-compatible server and "
                       "measure TTFT, inter-token latency, TPOT and e2e on the client")
    p.add_argument("workload", help="'bench' (the reference workload) or a JSONL workload file")
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name to send (default: the server's "
                   "first in /v1/models)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                   help="multiply arrival times by X (0.5: twice the rate; open loop)")
    p.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                   help="closed loop: keep N requests in flight, ignoring arrival times")
    p.add_argument("--num-requests", type=int, default=None, metavar="N",
                   help="only the first N requests of the workload")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="a checkpoint directory whose tokenizer turns token-id prompts of "
                   "conversations into the text of their chat messages")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="client processes sharing the sessions (for rates one event loop "
                   "cannot read)")
    p.add_argument("--stall-timeout", type=float, default=None, metavar="S",
                   help="fail a request whose server sends nothing for S seconds (default "
                   "600)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"result file (default {DEFAULT_OUT})")


def run(args: argparse.Namespace) -> int:
    from engine.errors import InvalidRequestError
    from replay.cli.paths import check_result_out
    from replay.loadgen.result import requests_frame, summarize, table_row, write_result
    from replay.loadgen.runner import DEFAULT_STALL_TIMEOUT_S, run_load
    from replay.whatif.report import variants_table
    from replay.workloads.builtin import reference_workload
    from replay.workloads.store import load_workload

    check_result_out(args.out)  # before the load, not after it
    requests = reference_workload() if args.workload == "bench" else load_workload(args.workload)
    if args.num_requests is not None:
        if args.num_requests < 1:
            raise InvalidRequestError(f"--num-requests must be >= 1, got {args.num_requests}")
        requests = requests[: args.num_requests]
    stall = DEFAULT_STALL_TIMEOUT_S if args.stall_timeout is None else args.stall_timeout
    measured, wall_s = run_load(requests, args.url, args.model, args.time_scale,
                                args.max_concurrency, tokenizer=args.tokenizer,
                                workers=args.workers, stall_timeout_s=stall)
    frame = requests_frame(measured)
    summary = summarize(frame, wall_s)
    settings = {"url": args.url, "model": args.model, "workload": args.workload,
                "time_scale": args.time_scale, "max_concurrency": args.max_concurrency,
                "workers": args.workers}
    path = write_result(args.out, frame, summary, settings)
    print(variants_table([table_row("client", summary)]))
    errors = frame[frame["error"] != ""]
    if len(errors):
        print(f"{len(errors)} of {len(frame)} requests failed; first: {errors['error'].iloc[0]}")
    print(f"wrote {path}")
    return 0 if not len(errors) else 1
