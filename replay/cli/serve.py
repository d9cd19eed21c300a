"""``replayllm serve``: the OpenAI-compatible server (engine.server), recording to a trace."""

from __future__ import annotations

import argparse
import math

from engine.config import parse_overrides

MAX_PORT = 65535


def add_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve", help="serve a model over the OpenAI API, recording a trace",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="on SIGINT or SIGTERM the server stops taking requests, lets running ones finish\n"
               "for --grace seconds, aborts the rest (each stream ends with an abort chunk),\n"
               "writes a complete trace and exits 0 (a signal while the model loads: once\n"
               "started, the server stops at once); exit 2: a bad setting, an address taken\n"
               "(found before the model loads), a complete trace in --trace-dir without\n"
               "--force, or the engine failed (its trace then ends incomplete, at the last\n"
               "flushed step)")
    serve.add_argument("--model", default=None, help="checkpoint directory (default: tiny model)")
    serve.add_argument("--trace-dir", default=None, help="record the served traffic here")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on")
    serve.add_argument("--served-model-name", default=None,
                       help="the model name clients send (default: --model, or replayllm-tiny)")
    serve.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                       help="on SIGINT/SIGTERM, how long running requests may finish")
    serve.add_argument("--kv-events-endpoint", default=None, metavar="URL",
                       help="publish vLLM KV-cache events over ZMQ, e.g. tcp://*:5557")
    serve.add_argument("--engine", choices=["process", "thread"], default="process",
                       help="where the engine core runs: its own process (default) or a thread "
                       "of the HTTP server's")
    serve.add_argument("--max-request-bytes", type=int, default=None, metavar="BYTES",
                       help="refuse a larger request body with a 413 (default: 128 bytes per "
                       "token of max_model_len, at least 8 MiB)")
    serve.add_argument("--max-waiting-prompts", type=int, default=None, metavar="N",
                       help="long prompts that may wait for the tokenizing threads; more are "
                       "a 429 with Retry-After (default: 8)")
    serve.add_argument("--force", action="store_true",
                       help="replace a complete trace already in --trace-dir")
    serve.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="a Config field (repeatable)")


def run(args: argparse.Namespace) -> int:
    from engine.errors import InvalidRequestError
    from engine.server.run import serve

    # Checked here, before the model loads: port 70000 was served on another port in silence,
    # --grace nan a traceback at shutdown.
    if not 1 <= args.port <= MAX_PORT:
        raise InvalidRequestError(f"--port must be in [1, {MAX_PORT}], got {args.port}")
    if not (math.isfinite(args.grace) and args.grace >= 0):
        raise InvalidRequestError(f"--grace must be a finite number of seconds >= 0, "
                                  f"got {args.grace}")
    if args.max_request_bytes is not None and args.max_request_bytes < 1:
        raise InvalidRequestError(f"--max-request-bytes must be >= 1, got "
                                  f"{args.max_request_bytes}")
    if args.max_waiting_prompts is not None and args.max_waiting_prompts < 0:
        raise InvalidRequestError(f"--max-waiting-prompts must be >= 0, got "
                                  f"{args.max_waiting_prompts}")
    summary = serve(args.model, trace_dir=args.trace_dir, host=args.host, port=args.port,
                    overrides=parse_overrides(args.overrides),
                    served_model_name=args.served_model_name, grace_s=args.grace,
                    kv_events_endpoint=args.kv_events_endpoint,
                    engine_mode=args.engine, max_request_bytes=args.max_request_bytes,
                    max_waiting_prompts=args.max_waiting_prompts, force=args.force)
    if summary is not None:
        print(f"replayllm serve: stopped after {summary['requests']} requests, "
              f"{summary['completion_tokens']} completion tokens"
              + (f"; trace: {args.trace_dir}" if args.trace_dir else ""), flush=True)
    return 0
