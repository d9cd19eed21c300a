"""``replayllm loadgen``: a workload against an OpenAI-compatible server, measured on the client."""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections import Counter
from typing import Any

DEFAULT_OUT = "loadgen.parquet"
EXIT_FAILED = 1  # the run went through, some requests failed (each with its error)

EPILOG = """exit status:
  0    every request answered
  1    some requests failed (the result is written, each failure with its status and message)
  2    nothing sent: a bad option or file, or a server that cannot be reached (no result)
  130  interrupted by Ctrl-C (SIGINT), 143 by SIGTERM: the requests completed so far
       written, the result marked partial

Completion tokens are the server's usage counts where it sends them, else (or where a count is
below them) its output chunks counted (one token each); the token_source column says which.
An output chunk is one of text, answer or reasoning, or one with empty text that is neither a
chat's role chunk nor a finish reason's (a token whose text the server holds back, as vLLM
sends); TTFT is the first, e2e the answer's end (its finish reason, else [DONE]). A request
that sent no output has no TTFT, one whose tokens came in one chunk no TPOT; the run says how
many.

A request refused with HTTP 429, 502, 503 or 504, or one that never reached the server (no
connection, or the connection lost before the request was written whole), is sent again
(--max-retries) after the server's Retry-After, else an exponential backoff jittered from
--seed; never one whose connection was lost after it was written (the server may be running
it), nor one cut mid-stream. Its TTFT and e2e count
from its first send, the waits included (the result's retries and retry_wait_s columns say how
many and how long; whatif --compare leaves the waits out, as the server never saw them)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("loadgen", help="send a workload to an OpenAI-compatible server and "
                       "measure TTFT, inter-token latency, TPOT and e2e on the client",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", help="'bench' (the reference workload) or a workload file "
                   "(JSONL or Parquet)")
    p.add_argument("--url", required=True, help="the server's base URL, e.g. "
                   "http://127.0.0.1:8000 (a trailing /v1 is dropped)")
    p.add_argument("--model", default=None, help="model name to send (default: the server's "
                   "first in /v1/models; a name its /v1/models does not list is refused)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="X",
                   help="multiply arrival times by X (0.5: twice the rate; open loop)")
    p.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                   help="closed loop: keep N requests in flight, ignoring arrival times")
    p.add_argument("--num-requests", type=int, default=None, metavar="N",
                   help="only the first N requests of the workload (the file is read no "
                   "further)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="a checkpoint directory whose tokenizer turns token-id prompts of "
                   "conversations into the text of their chat messages")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="client processes sharing the sessions (for rates one event loop "
                   "cannot read)")
    p.add_argument("--stall-timeout", type=float, default=None, metavar="S",
                   help="fail a request whose server sends nothing for S seconds (default "
                   "600)")
    p.add_argument("--request-timeout", type=float, default=None, metavar="S",
                   help="fail a request not answered whole in S seconds (default 3600)")
    p.add_argument("--max-retries", type=int, default=None, metavar="N",
                   help="send a request refused with HTTP 429/502/503/504, or that never "
                   "reached the server (no connection), again up to N times, after its "
                   "Retry-After or a backoff, within --request-timeout (default 3; 0: never)")
    p.add_argument("--seed", type=int, default=None, metavar="N",
                   help="seed of the retries' backoff jitter: the same seed, the same waits "
                   "(default: one drawn at random, written to the result)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="bearer token for a server started with an API key (default: "
                   "$OPENAI_API_KEY; never written to the result)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"result file (default {DEFAULT_OUT})")


def run(args: argparse.Namespace) -> int:
    from replay.cli import progress
    from replay.cli.paths import check_result_out
    from replay.cli.run import load_requests
    from replay.loadgen.result import (
        requests_frame,
        summarize,
        table_row,
        token_sources,
        unmeasured,
        write_result,
    )
    from replay.loadgen.runner import run_load
    from replay.loadgen.settings import (
        DEFAULT_MAX_RETRIES,
        DEFAULT_REQUEST_TIMEOUT_S,
        DEFAULT_STALL_TIMEOUT_S,
        base_url,
        check_settings,
    )
    from replay.whatif.report import variants_table

    stall = DEFAULT_STALL_TIMEOUT_S if args.stall_timeout is None else args.stall_timeout
    total = DEFAULT_REQUEST_TIMEOUT_S if args.request_timeout is None else args.request_timeout
    retries = DEFAULT_MAX_RETRIES if args.max_retries is None else args.max_retries
    seed = random.SystemRandom().randrange(2**31) if args.seed is None else args.seed
    # Every check before the load (and before reading a large workload), not after it.
    check_settings(args.time_scale, args.max_concurrency, args.workers, stall, total,
                   args.num_requests, max_retries=retries)
    url = base_url(args.url)
    check_result_out(args.out)
    requests = load_requests(args.workload, args.num_requests)  # as run and whatif read them
    measured, wall_s = run_load(requests, url, args.model, args.time_scale,
                                args.max_concurrency, tokenizer=args.tokenizer,
                                workers=args.workers, stall_timeout_s=stall,
                                request_timeout_s=total, max_retries=retries, seed=seed,
                                api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
                                # a log or a CI job's stderr holds no bar redraws: the
                                # commands' one rule (replay.cli.progress)
                                use_tqdm=progress.progress_wanted())
    done = [m for m in measured if m is not None and m.done]
    partial = len(done) < len(measured)
    if partial and not done:
        print("replayllm loadgen: interrupted before any request completed; nothing written",
              file=sys.stderr)
        return _interrupted_status()
    frame = requests_frame(done)
    summary = summarize(frame, wall_s)
    settings: dict[str, Any] = {
        "url": url, "model": _answered_model(done) or args.model, "workload": args.workload,
        "time_scale": args.time_scale, "max_concurrency": args.max_concurrency,
        "workers": args.workers, "stall_timeout_s": stall, "request_timeout_s": total,
        # Of the answered requests, whose tokens the summary counts (a failed stream's count
        # is its chunks: the client stops reading at the failure, before any usage).
        "max_retries": retries, "seed": seed,
        "completion_tokens_from": token_sources(frame[frame["error"] == ""]),
        "partial": partial, "requests_planned": len(measured)}
    path = write_result(args.out, frame, summary, settings)
    print(variants_table([table_row("client", summary)]))
    if "chunks" in settings["completion_tokens_from"]:
        print("note: the server sent no usage counts (or ones below the output chunks seen) for "
              "some requests; their completion tokens are output chunks counted (one token a "
              "chunk)")
    note = _model_note(done, args.model)
    if note:
        print(note)
    for line in unmeasured(frame):
        print(line)
    retried = frame[frame["retries"] > 0]
    if len(retried):
        print(f"{len(retried)} requests were retried (refused with HTTP 429/502/503/504, or "
              f"never reaching the server), {int(retried['retries'].sum())} retries in "
              "all; their TTFT and e2e count from the first send, the waits included "
              "(retry_wait_s)")
    errors = frame[frame["error"] != ""]
    if len(errors):
        print(f"{len(errors)} of {len(frame)} requests failed ({_kinds(errors['error'])}); "
              f"first: {errors['error'].iloc[0]}")
    print(f"wrote {path}")
    if partial:
        print(f"replayllm loadgen: interrupted: wrote a partial result, the {len(done)} of "
              f"{len(measured)} requests that completed, to {path}", file=sys.stderr)
        return _interrupted_status()
    return EXIT_FAILED if len(errors) else 0


def _interrupted_status() -> int:
    """The exit status of a run a signal cut short: that signal's, as every command's
    (``replay.cli.interrupt.exit_status``); SIGTERM's was Ctrl-C's 130."""
    import signal

    from replay.cli.interrupt import exit_status
    from replay.loadgen.interrupt import stop_signal

    return exit_status(stop_signal() or signal.SIGINT)


def _answered_model(measured: list[Any]) -> str | None:
    """The model the server answered with (its chunks' ``model``; a request without an answer:
    the model it was sent with, ``--model`` or the server's first in ``/v1/models``), the most
    common where they differ; None where no request named one."""
    names = Counter(m.model for m in measured if m.model)
    return names.most_common(1)[0][0] if names else None


def _model_note(measured: list[Any], asked: str | None) -> str | None:
    """A note where the answers name another model than ``--model``, or several models (a
    proxy's fallback, a router over deployments): the run measured what answered, and the
    result records one name only (``_answered_model``); None where they all name the one
    asked for, or one name without ``--model``."""
    names = Counter(m.model for m in measured if m.model)
    if not names or set(names) == {asked} or (asked is None and len(names) == 1):
        return None
    shown = [(name, n) for name, n in names.most_common() if name != asked]
    listed = ", ".join(f"{name!r} ({n} of {len(measured)} requests)" if not k else
                       f"{name!r} ({n})" for k, (name, n) in enumerate(shown))
    said = (f"asked for --model {asked!r}, the server answered as {listed}" if asked is not None
            else f"the server answered under {len(names)} model names: {listed}")
    return f"note: {said}; the result records {_answered_model(measured)!r}"


def _kinds(errors: Any) -> str:
    """How many failures of each kind: "2 HTTP 429, 1 timed out, 1 other"."""
    from replay.loadgen.answer import TIMED_OUT

    def kind(error: str) -> str:
        if error.startswith("HTTP "):
            return error.split(":")[0]
        return TIMED_OUT if error.startswith(TIMED_OUT) else "other"

    counts = Counter(kind(e) for e in errors)
    return ", ".join(f"{n} {name}" for name, n in counts.most_common())
