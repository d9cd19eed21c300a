"""``replayllm workload generate|import|describe``: make, bring in and summarise workloads."""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Iterator
from typing import Any

from tqdm.auto import tqdm

from engine.config import Config
from engine.errors import InvalidRequestError
from replay.cli import progress
from replay.cli.paths import check_plot_file, check_workload_out
from replay.workloads.arrivals import PROCESSES, ArrivalProcess
from replay.workloads.distributions import parse
from replay.workloads.generate import MAX_NUM_REQUESTS
from replay.workloads.import_options import MOONCAKE_BLOCK_SIZE, OVER_LENGTH
from replay.workloads.imports import FORMATS, TRACE_FORMATS, check_format_options
from replay.workloads.request import REFERENCE_TEMPERATURE

DISTRIBUTIONS = "fixed:V, uniform:LO,HI, normal:MEAN,STD, lognormal:MEAN,SIGMA, zipf:A,MAX, " \
    "exponential:MEAN or empirical:FILE"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``workload`` and its three subcommands to ``replayllm``'s subparsers."""
    p = subparsers.add_parser("workload", help="generate, import or describe a workload file",
                              description="Workload files (docs/workloads.md): JSONL or Parquet.")
    sub = p.add_subparsers(dest="workload_command", required=True, metavar="SUBCOMMAND")

    gen = sub.add_parser("generate", help="a synthetic workload: arrivals, lengths, prefixes, "
                         "conversations")
    gen.add_argument("--out", required=True, help="file to write (.jsonl or .parquet)")
    gen.add_argument("--num-requests", type=int, required=True,
                     help=f"first turns to generate, at most {MAX_NUM_REQUESTS:,} (each "
                     "conversation adds its later turns)")
    gen.add_argument("--arrivals", choices=PROCESSES, default=None,
                     help="arrival process (default: poisson with --rate, else all at 0; "
                     "constant, poisson and gamma need --rate)")
    gen.add_argument("--rate", type=float, default=None, help="requests/s (default: all at 0)")
    gen.add_argument("--burstiness", type=float, default=1.0,
                     help="gamma shape, as vllm bench serve (1: Poisson, <1 burstier)")
    gen.add_argument("--schedule", help="with --arrivals schedule: one arrival time (s) a line")
    gen.add_argument("--prompt-len", default="fixed:256", help=f"new tokens of a first turn: "
                     f"{DISTRIBUTIONS}")
    gen.add_argument("--output-len", default="fixed:128", help="max_tokens, same forms")
    gen.add_argument("--system-prompts", type=int, default=0,
                     help="N shared system prompts before the first turn's own tokens")
    gen.add_argument("--system-prompt-len", default=None,
                     help="their lengths (default fixed:512)")
    gen.add_argument("--popularity", type=float, default=None,
                     help="Zipf exponent over system prompt ranks (default 1; 0: uniform)")
    gen.add_argument("--turns", default="fixed:1", help="turns per conversation")
    gen.add_argument("--think-time", default="fixed:0", help="seconds between an answer and "
                     "the next turn (with --turns of more than one)")
    gen.add_argument("--user-len", default=None, help="new tokens of a later turn (default: "
                     "--prompt-len; with --turns of more than one)")
    gen.add_argument("--temperature", type=float, default=0.6)
    gen.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                     help="let a request stop at EOS before its max_tokens")
    gen.add_argument("--hash-block-size", type=int, default=None,
                     help="tokens per named block of a system prompt (default 16)")
    gen.add_argument("--seed", type=int, default=0)

    imp = sub.add_parser("import", help="a public trace or a workload file as a workload file")
    imp.add_argument("source", help="trace file")
    imp.add_argument("--format", required=True, choices=FORMATS)
    imp.add_argument("--out", required=True, help="file to write (.jsonl or .parquet)")
    imp.add_argument("--start", type=float, default=0.0, help="window start (s of the trace)")
    imp.add_argument("--end", type=float, default=math.inf, help="window end (s of the trace)")
    imp.add_argument("--limit", type=int, default=None, help="keep at most N first turns")
    imp.add_argument("--time-scale", type=float, default=1.0,
                     help="multiply arrival and think times, >= 0 (0.5: the same trace twice as "
                     "fast; 0: everything at once)")
    imp.add_argument("--max-prompt-len", type=int, default=None)
    imp.add_argument("--over-length", choices=OVER_LENGTH, default="drop",
                     help="what to do with a prompt over --max-prompt-len (each one counted)")
    imp.add_argument("--block-size", type=int, default=None,
                     help="mooncake: tokens per hash_ids entry (default 512: Mooncake; Bailian "
                     "16)")
    imp.add_argument("--rate", type=float, default=None,
                     help="sharegpt: conversations/s, Poisson (default: all at 0)")
    imp.add_argument("--model", default=None, help="sharegpt: tokenizer directory (default: "
                     "the tiny model's Qwen vocabulary)")
    imp.add_argument("--filter-model", default=None, metavar="NAME",
                     help="burstgpt: keep the rows of this Model only (ChatGPT or GPT-4; "
                     "case ignored; the others dropped, counted)")
    imp.add_argument("--temperature", type=float, default=None,
                     help="the requests' temperature (default 0.6; not with --format replayllm, "
                     "whose requests keep their own)")
    imp.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                     help="let a request stop at EOS before the trace's output length")
    imp.add_argument("--seed", type=int, default=None, help="salt of the synthesized tokens, "
                     "and of sharegpt's --rate (default 0)")
    imp.add_argument("--ignore-unknown-fields", action="store_true",
                     help="mooncake and replayllm: read past fields this version does not "
                     "know (else an error)")

    desc = sub.add_parser("describe", help="requests, span, rate, lengths, prefix reuse, plots")
    desc.add_argument("workload", help="workload file (.jsonl or .parquet)")
    desc.add_argument("--block-size", type=int, default=Config().kvcache_block_size,
                      help="block size of the prefix-reuse figure (default: the engine's)")
    desc.add_argument("--plots", default=None, metavar="PNG", help="write the plots here")
    desc.add_argument("--ignore-unknown-fields", action="store_true")
    return p


def _progress(items: Any, desc: str, total: int | None = None) -> Any:
    """``items`` with a progress bar on stderr when it is a terminal (``replay.cli.progress``,
    as ``run`` and ``loadgen`` draw theirs): a redirected or captured stderr holds only the
    command's own lines (a log of a failed import held the bar's redraws before its one error
    line)."""
    return tqdm(items, desc=desc, total=total, unit=" req", dynamic_ncols=True,
                mininterval=0.5, disable=not progress.progress_wanted())


def _generate(args: argparse.Namespace) -> int:
    from replay.workloads.generate import GenerateSpec, Generator
    from replay.workloads.store import WorkloadWriter

    spec = GenerateSpec(
        num_requests=args.num_requests,
        arrivals=ArrivalProcess(args.arrivals, args.rate, args.burstiness, args.schedule),
        prompt_len=parse(args.prompt_len, "--prompt-len"),
        output_len=parse(args.output_len, "--output-len"),
        system_prompts=args.system_prompts,
        system_prompt_len=parse(args.system_prompt_len, "--system-prompt-len")
        if args.system_prompt_len is not None else None,
        popularity=args.popularity,
        turns=parse(args.turns, "--turns"),
        think_time_s=parse(args.think_time, "--think-time"),
        user_len=parse(args.user_len, "--user-len") if args.user_len else None,
        temperature=args.temperature, ignore_eos=args.ignore_eos,
        hash_block_size=args.hash_block_size, seed=args.seed,
    )
    if spec.system_prompts:  # the defaults the spec set, recorded in the header's command
        args.system_prompt_len = args.system_prompt_len or spec.system_prompt_len.text
        args.popularity, args.hash_block_size = spec.popularity, spec.hash_block_size
    if args.rate is not None:  # poisson, the default with a rate (without one: null, all at 0)
        args.arrivals = spec.arrivals.kind
    check_workload_out(args.out)
    generator = Generator(spec)
    with _removed_if_stopped(WorkloadWriter(args.out)) as writer:
        writer.write_all(_progress(generator, "generate"))
        counts = generator.counts
        writer.close({"generated": {"command": _command(args), "requests": counts.requests,
                                    "conversations": counts.conversations,
                                    "clipped": counts.clipped}})
    clipped = ", ".join(f"{n:,} {what} values clipped into range"
                        for what, n in counts.clipped.items())
    print(f"wrote {counts.requests:,} requests ({counts.conversations:,} conversations) to "
          f"{args.out}" + (f"; {clipped}" if clipped else ""))
    return 0


def _command(args: argparse.Namespace) -> dict[str, Any]:
    """The options of the command, as its output's header records them: every one, so that
    given back they write the same file. A float JSON cannot hold (``--rate inf``, import's
    default ``--end``) is the string the option takes (``inf``); dropped, the header's command
    lost the rate and kept the ``poisson`` it implied, which without one is an error."""
    return {k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in vars(args).items() if k not in ("command", "workload_command")}


def _import(args: argparse.Namespace) -> int:
    from replay.workloads.import_options import ImportCounts, ImportOptions
    from replay.workloads.imports import import_workload
    from replay.workloads.store import WorkloadWriter

    check_workload_out(args.out, args.source)
    # flags given, even at their default value, that the format does not take: one line
    check_format_options(args.format, {flag for flag, value in (
        ("--temperature", args.temperature), ("--seed", args.seed)) if value is not None})
    if args.format == "mooncake" and args.block_size is None:
        args.block_size = MOONCAKE_BLOCK_SIZE  # the default, recorded in the header's command
    if args.format in TRACE_FORMATS:  # the defaults, recorded in the header's command
        args.temperature = REFERENCE_TEMPERATURE if args.temperature is None \
            else args.temperature
        args.seed = 0 if args.seed is None else args.seed
    options = ImportOptions(
        start_s=args.start, end_s=args.end, limit=args.limit, time_scale=args.time_scale,
        max_prompt_len=args.max_prompt_len, over_length=args.over_length,
        seed=args.seed or 0, block_size=args.block_size,
        temperature=REFERENCE_TEMPERATURE if args.temperature is None else args.temperature,
        ignore_eos=args.ignore_eos, ignore_unknown_fields=args.ignore_unknown_fields,
        model=args.model, rate=args.rate,
        filter_model=args.filter_model,
    )
    counts = ImportCounts()
    with _removed_if_stopped(WorkloadWriter(args.out)) as writer:
        writer.write_all(_progress(import_workload(args.source, args.format, options, counts),
                                   "import"))
        writer.close({"imported": {"source": str(args.source), "format": args.format,
                                   "command": _command(args), **counts.to_dict()}})
    print(f"wrote {counts.kept:,} requests to {args.out}: {counts.describe()}")
    return 0


def _describe(args: argparse.Namespace) -> int:
    from replay.workloads.describe import summarize, table
    from replay.workloads.store import read_workload

    if args.block_size < 1:
        raise InvalidRequestError(f"--block-size must be >= 1, got {args.block_size}")
    if args.plots:
        check_plot_file(args.plots)
    summary = summarize(_progress(read_workload(args.workload, args.ignore_unknown_fields),
                                  "describe"), args.block_size)
    if not summary.requests:  # as run refuses it (replay/cli/run.py load_requests)
        raise InvalidRequestError(f"{args.workload}: the workload holds no requests")
    print(table(summary))
    if args.plots:
        from replay.workloads.plots import plot_summary

        print(f"plots: {plot_summary(summary, args.plots, title=str(args.workload))}")
    return 0


@contextlib.contextmanager
def _removed_if_stopped(writer: Any) -> Iterator[Any]:
    """``writer`` (a ``WorkloadWriter``), its ``OUT.partial`` removed whatever stops the block
    (Ctrl-C, SIGTERM, an error), also between the writes and the final rename, outside
    ``write_all``'s own clean-up. ``OUT`` itself is replaced only by ``close``'s rename."""
    try:
        yield writer
    except BaseException:
        writer.abort()
        raise


def run(args: argparse.Namespace) -> int:
    """Run ``replayllm workload SUBCOMMAND``. SIGTERM ends it as Ctrl-C does (no
    ``OUT.partial`` left, an earlier ``OUT`` kept), exit 143, as every command
    (``replay.cli.interrupt.terminate_as_interrupt``)."""
    command = {"generate": _generate, "import": _import, "describe": _describe}[
        args.workload_command]
    return command(args)
