"""The ``replayllm`` command line. Every error is one line on stderr and a non-zero exit."""

from __future__ import annotations

import argparse
import re
import signal
import sys
from collections.abc import Callable

from engine.errors import ReplayLLMError
from replay.cli.interrupt import Terminated, exit_status, terminate_as_interrupt
from tracing.errors import TraceError, one_line

EXIT_DIVERGED = 1
EXIT_USER_ERROR = 2


def _add_config_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Config field, e.g. --set num_kvcache_blocks=400 (repeatable)",
    )


def _add_force(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--force", action="store_true", help=what)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replayllm",
        description="An event-sourced LLM inference engine: record, verify, replay, simulate.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="record a small run on the embedded tiny model and verify")
    demo.add_argument("--out", default="out/demo-trace",
                      help="trace directory to write (an earlier demo's trace is replaced)")
    _add_force(demo, "replace a complete trace another command recorded there")

    run = sub.add_parser("run", help="run a workload on a model and record a trace")
    run.add_argument("--model", default=None, help="checkpoint directory (default: tiny model)")
    run.add_argument(
        "--workload", default="bench",
        help="'bench' (the reference workload) or a workload file (JSONL or Parquet, "
        "docs/workloads.md)"
    )
    run.add_argument("--out", required=True, help="trace directory to write")
    _add_force(run, "replace a complete trace recorded there earlier")
    run.add_argument("--num-seqs", type=int, default=None, help="use only the first N requests")
    run.add_argument("--warm-up", type=int, default=0, metavar="N",
                     help="untraced runs of the workload first, so the traced run starts warm")
    _add_config_overrides(run)

    verify = sub.add_parser("verify", help="replay a trace and check every decision matches")
    verify.add_argument("trace", help="trace directory")

    inspect = sub.add_parser("inspect", help="summarise a trace in a few lines")
    inspect.add_argument("trace", help="trace directory")
    inspect.add_argument("--json", action="store_true",
                         help="the same figures as one JSON object (for scripts)")

    export = sub.add_parser("export", help="export a trace for a viewer")
    export.add_argument("trace", help="trace directory")
    export.add_argument("--format", choices=["perfetto", "vllm-kv-events"], default="perfetto")
    export.add_argument("--out", default=None, help="output file (default: TRACE/trace.json, "
                        "or TRACE/kv-events.msgpack; - writes the perfetto JSON to stdout)")
    _add_force(export, "replace a file that is not an earlier export")

    make_model = sub.add_parser("make-model", help="write a random-weight Qwen3 checkpoint")
    make_model.add_argument(
        # engine.model.checkpoint.PRESETS, named here: importing it would import torch for --help
        "--preset", choices=["tiny", "qwen3-0.6b", "qwen3-0.6b-confident"], default="tiny"
    )
    make_model.add_argument("--out", required=True, help="directory to write")
    make_model.add_argument("--seed", type=int, default=0, help="weight seed, 0 to 2^63 - 1")
    _add_force(make_model, "replace a checkpoint make-model wrote there earlier")

    from replay.cli import whatif as whatif_cli

    whatif_cli.add_parser(sub)
    from replay.cli import tune as tune_cli

    tune_cli.add_parser(sub)

    from replay.cli import workload as workload_cli

    workload_cli.add_parser(sub)
    from replay.cli import profile as profile_cli

    profile_cli.add_parser(sub)

    from replay.cli import serve as serve_cli

    serve_cli.add_parser(sub)

    from replay.cli import loadgen as loadgen_cli

    loadgen_cli.add_parser(sub)

    bench = sub.add_parser("bench", help="benchmarks (scheduler on CPU; engine on a GPU)")
    bench.add_argument(
        "suite", nargs="?", choices=["scheduler", "engine", "whatif"], default="engine",
        help="scheduler (CPU), engine (a CUDA GPU), whatif (CPU); run from a source checkout"
    )
    bench.add_argument("--json", default=None, help="also write the results here as JSON")
    bench.add_argument("--repeat", type=int, default=3, help="timed repetitions (median kept)")
    return parser


def _cmd_demo(args: argparse.Namespace) -> int:
    from replay.cli.demo import run_demo

    return run_demo(args.out, force=args.force)


def _cmd_run(args: argparse.Namespace) -> int:
    from engine.config import parse_overrides
    from replay.cli.run import run_command

    return run_command(args.model, args.workload, args.out, args.num_seqs,
                       parse_overrides(args.overrides), warm_up=args.warm_up, force=args.force)


def _cmd_verify(args: argparse.Namespace) -> int:
    from engine.policy import policy_change_note
    from replay.verify import check_verifiable, verify
    from tracing.reader import read_trace

    trace = read_trace(args.trace)
    check_verifiable(trace)  # a killed run that committed no step: exit 2, nothing to verify
    note = policy_change_note(dict(trace.header))
    if note:  # said before the replay: its divergences may be the policy's new code
        print(f"note: {note}", flush=True)
    result = verify(trace)
    print(result.report())
    return 0 if result.identical else EXIT_DIVERGED


def _cmd_inspect(args: argparse.Namespace) -> int:
    from tracing.inspect import describe, summarize
    from tracing.reader import read_trace

    trace = read_trace(args.trace)
    if args.json:
        import json

        print(json.dumps(summarize(trace), indent=1))
    else:
        print(describe(trace))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from tracing.export_command import run_export

    line = run_export(args.trace, args.out, args.format, force=args.force)
    if line is not None:  # None: the export went to stdout (--out -)
        print(line)
    return 0


def _cmd_make_model(args: argparse.Namespace) -> int:
    from engine.model.checkpoint import make_model

    path = make_model(args.preset, args.out, seed=args.seed, force=args.force)
    print(f"wrote {args.preset} checkpoint to {path}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib
    import os

    if args.repeat < 1:  # 0 fell back to 3 in silence, -1 was an AssertionError
        raise ReplayLLMError(f"--repeat must be >= 1, got {args.repeat}")
    if args.json == "":  # it used to mean "no JSON" in silence
        raise ReplayLLMError("--json is empty: give the file to write the results to")
    if args.json:  # checked before the benchmark runs, not after
        from replay.cli.paths import check_bench_json

        check_bench_json(args.json)
    # The benchmarks live in the source checkout (benchmarks/), not in the installed package.
    if os.path.isfile(os.path.join("benchmarks", "__init__.py")) and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        suite = importlib.import_module(f"benchmarks.{args.suite}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("benchmarks", f"benchmarks.{args.suite}"):
            raise
        raise ReplayLLMError("the benchmarks are not installed: run replayllm bench from the "
                             "root of a source checkout") from None
    return suite.main(json_path=args.json, repeat=args.repeat)


def _cmd_whatif(args: argparse.Namespace) -> int:
    from replay.cli import whatif as whatif_cli

    return whatif_cli.run(args)


def _cmd_tune(args: argparse.Namespace) -> int:
    from replay.cli import tune as tune_cli

    return tune_cli.run(args)


def _cmd_workload(args: argparse.Namespace) -> int:
    from replay.cli import workload as workload_cli

    return workload_cli.run(args)


def _cmd_profile(args: argparse.Namespace) -> int:
    from replay.cli import profile as profile_cli

    return profile_cli.run(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    from replay.cli import serve as serve_cli

    return serve_cli.run(args)


def _cmd_loadgen(args: argparse.Namespace) -> int:
    from replay.cli import loadgen as loadgen_cli

    return loadgen_cli.run(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _cmd_demo,
    "run": _cmd_run,
    "verify": _cmd_verify,
    "inspect": _cmd_inspect,
    "export": _cmd_export,
    "make-model": _cmd_make_model,
    "bench": _cmd_bench,
    "whatif": _cmd_whatif,
    "tune": _cmd_tune,
    "workload": _cmd_workload,
    "profile": _cmd_profile,
    "serve": _cmd_serve,
    "loadgen": _cmd_loadgen,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``replayllm`` console script."""
    args = build_parser().parse_args(argv)
    try:
        check_path_options(args)
        with terminate_as_interrupt():
            status = COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return status
    except (ReplayLLMError, TraceError) as exc:
        print(f"replayllm {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except (MemoryError, RuntimeError) as exc:
        if (detail := out_of_memory(exc)) is None:
            raise
        print(f"replayllm {args.command}: error: {detail}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:
        # `replayllm inspect T | head -1`: the reader has what it wanted.
        _silence_stdout()
        return 0
    except Terminated:
        print(f"replayllm {args.command}: interrupted (SIGTERM)", file=sys.stderr)
        return exit_status(signal.SIGTERM)
    except KeyboardInterrupt:
        print(f"replayllm {args.command}: interrupted", file=sys.stderr)
        return exit_status(signal.SIGINT)


# Arguments naming a path, to write or to read: an empty one (a script's unset variable) read as
# the working directory (`verify ""`: ".: not a trace directory"; `run --model ""` looked for a
# checkpoint there) or as not given (`--plots ""` drew nothing, `--timing-from ""` fitted on
# another trace than asked, exit 0). ``export --out`` has its own message (``-`` is standard
# output), ``bench --json`` and ``whatif --profile`` theirs; loadgen's ``--model`` is a name.
PATH_OPTIONS = ("out", "trace_dir", "trace_out", "report", "plots", "timing_from", "host_from",
                "compare", "tokenizer", "schedule", "model", "workload")
# Positional path arguments, named as the docs write them.
PATH_POSITIONALS = {"trace": "TRACE", "source": "SOURCE", "workload": "WORKLOAD"}
# (command, argument) pairs that are no path, or keep a message of their own.
NOT_CHECKED = {("export", "out"), ("loadgen", "model")}
# Commands whose ``workload`` is a positional argument, not ``--workload``.
WORKLOAD_POSITIONAL = ("loadgen", "workload")


def check_path_options(args: argparse.Namespace) -> None:
    """Refuse an empty path argument in one line naming it (``--out ""``, ``verify ""``)."""
    for name in (*PATH_OPTIONS, *PATH_POSITIONALS):
        if getattr(args, name, None) != "" or (args.command, name) in NOT_CHECKED:
            continue
        positional = name in ("trace", "source") or (
            name == "workload" and args.command in WORKLOAD_POSITIONAL)
        shown = PATH_POSITIONALS[name] if positional else f"--{name.replace('_', '-')}"
        raise ReplayLLMError(f"{shown} is empty: give a path")


def out_of_memory(exc: BaseException) -> str | None:
    """One line for an allocation the settings made too large (``--set num_kvcache_blocks=10**8``
    on the CPU: torch's "can't allocate memory", CUDA's "out of memory"), None for any other
    error: a bug keeps its traceback."""
    text = one_line(exc)
    if not isinstance(exc, MemoryError) and not any(
            marker in text for marker in ("can't allocate memory", "out of memory")):
        return None
    tried = re.search(r"[Tt]ried to allocate ([\d.,]+ ?[KMGT]?i?B|\d+ bytes)", text)
    wanted = f"an allocation of {tried.group(1)}" if tried else "an allocation"
    return (f"out of memory: {wanted} does not fit; lower the sizes set (num_kvcache_blocks, "
            "kv_cache_bytes, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens)")


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush finds no broken pipe."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file descriptor (captured in a test)
        pass


if __name__ == "__main__":
    sys.exit(main())
