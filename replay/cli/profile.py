"""``replayllm profile``: a device profile of a model (engine/profiling.py) on the real runner."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from typing import Any

# A profile covers the longest steps the model can take: override any with --set.
PROFILE_DEFAULTS: dict[str, Any] = {
    "max_model_len": 32768,
    "max_num_seqs": 512,
    "max_num_batched_tokens": 32768,
    "calibration_repeats": 0,
    # A policy with mixed batches, so the runner captures the mixed-step graphs the grid times.
    "policy": "chunked",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from engine.profiling import DEFAULT_BUDGET_S, DEFAULT_REPEATS, MAX_REPEATS

    p = subparsers.add_parser(
        "profile", help="time the model runner over every step shape (a device profile)")
    p.add_argument("--model", default=None, help="checkpoint directory (default: tiny model)")
    p.add_argument("--out", required=True, help="profile file to write (JSON)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a Config field (defaults: " + ", ".join(
                       f"{k}={v}" for k, v in PROFILE_DEFAULTS.items()) + ")")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"seconds of timing at most (default {DEFAULT_BUDGET_S:.0f}): a point "
                   "forecast from those timed to end past it is skipped, so the grid is trimmed "
                   "from its last level (engine/profiling.py LEVELS)")
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                   help=f"timed runs per point after one warm-up (default {DEFAULT_REPEATS}, at "
                   f"most {MAX_REPEATS}; a point stops repeating at the budget)")
    p.add_argument("--quiet", action="store_true", help="no line per point")
    return p


def engine_version() -> str:
    try:
        return metadata.version("replayllm")
    except metadata.PackageNotFoundError:
        return "unknown"


def run(args: argparse.Namespace) -> int:
    from engine.config import Config, parse_overrides
    from engine.model.checkpoint import default_model_dir
    from engine.profiling import ProfileError, check_profile_settings, run_profile, save_profile
    from engine.runner.model_runner import ModelRunner
    from replay.cli import interrupt
    from replay.cli.paths import check_profile_out
    from tracing.header import git_commit
    from tracing.outfile import write_via_temporary

    check_profile_settings(args.budget_s, args.repeats)  # before the model loads
    check_profile_out(args.out)  # before the minutes of timing, not after them
    model_dir = str(args.model) if args.model is not None else str(default_model_dir())
    config = Config(model=model_dir, **{**PROFILE_DEFAULTS, **parse_overrides(args.overrides)})
    # Ctrl-C, SIGTERM: stop between two points and keep what was timed (a second one: at once).
    with interrupt.deferred_signals():
        runner = ModelRunner(config)
        try:
            config = config.replace(num_kvcache_blocks=runner.num_kvcache_blocks,
                                    eos=runner.eos_token_id)
            profile = run_profile(runner, config, args.budget_s, args.repeats,
                                  engine_version=engine_version(),
                                  progress=None if args.quiet else print,
                                  stop=lambda: _interruption() is not None)
        finally:
            runner.close()
        stopped = _interruption()
    rows, points = len(profile["rows"]), profile["points"]
    if stopped and not rows:
        print(f"replayllm profile: interrupted ({stopped.name}) before any step was timed: "
              "nothing written", file=sys.stderr)
        return stopped.exit_status
    if not points:  # a file the what-if would refuse ("no timed steps"): refused here
        raise ProfileError("no step shape fits these settings (max_model_len, max_num_seqs, "
                           "max_num_batched_tokens, num_kvcache_blocks): nothing to time")
    if not rows:
        raise ProfileError(f"--budget-s {args.budget_s:g} timed none of the {points} steps: "
                           "nothing written; give it more seconds")
    profile["git_commit"] = git_commit()
    write_via_temporary(args.out, lambda tmp: save_profile(profile, tmp))
    if stopped:
        print(f"replayllm profile: interrupted ({stopped.name}): wrote the {rows} steps timed so "
              f"far (of {points}) to {args.out}, marked interrupted", file=sys.stderr)
        return stopped.exit_status
    key = ", ".join(f"{k} {v}" for k, v in profile["key"].items())
    print(f"wrote {rows} timed steps ({profile['skipped']} of {points} "
          f"skipped for the {args.budget_s:g} s budget) in {profile['elapsed_s']:.1f} s to "
          f"{args.out}: {key}")
    return 0


def _interruption() -> Any:
    """The deferred Ctrl-C or SIGTERM (``replay.cli.interrupt.RunInterrupted``), or None."""
    from replay.cli import interrupt

    try:
        interrupt.check()
    except interrupt.RunInterrupted as stop:
        return stop
    return None
