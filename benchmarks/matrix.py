"""The what-if validation matrix: workload families x configurations, recorded on a GPU, each
predicted from one source on any CPU.

    python -m benchmarks.matrix prepare DIR            # the workload files (CPU, seconds)
    python -m benchmarks.matrix record MODEL DIR OUT   # on the GPU: one trace per cell in OUT
    python -m benchmarks.matrix record MODEL DIR OUT --only CELL --repeat 3   # spread
    python -m benchmarks.matrix fidelity TRACES --source TRACE [--profile PROFILE]
        [--cost-option NAME=VALUE ...]                 # a mechanism switched (an ablation)
    python -m benchmarks.matrix ablation TRACES --source TRACE [--profile PROFILE] [...]
    python -m benchmarks.matrix steps TRACES --source TRACE [--profile PROFILE] [...]
    python -m benchmarks.matrix drift TRACES --source TRACE [--profile PROFILE] [...]
    python -m benchmarks.matrix waits TRACES --source TRACE [--profile PROFILE] [...]
    python -m benchmarks.matrix spread TRACES OTHER [--summary]   # two device calls

``prepare`` writes each family's workload with the project's own generators and importers;
``record`` runs every cell in one process after untraced warm-up engines, one per policy the
cells use (so every recorded engine starts warm, its kernels compiled for prefill, decode and
mixed steps alike, as the committed reference does); ``--repeat N`` records each cell N times
(``CELL``, ``CELL-r2``, ...: the run-to-run spread). ``fidelity`` predicts each recorded cell
from the source trace's step-time model (and a device profile, where given) and compares the
prediction with the recording (``replay.whatif.fidelity.matrix_rows``; an incomplete cell, a
killed recording, is shown as such and not compared; an incomplete source is refused, exit 2);
``ablation`` sums that table up once per mechanism switched off; ``steps`` prices each cell's
recorded steps by the model, per step class, and apart those after the engine idled
(``replay.whatif.matrix_study``); ``drift`` cuts
each cell's run into spans of wall time and shows its host's speed moving (the median host time
of its decodes and eager steps) and the eager steps' device time following it (``host_drift``);
``waits`` splits each cell's TTFT into the queue (arrival to first scheduled) and the rest,
recorded against predicted, beside the recorded steps requests waited through priced by the
model (``request_waits``, ``queued_steps``: a queue error far above theirs is the run's
saturation amplifying it);
``spread`` reads each cell recorded in both directories (two device calls, hosts) as
``fidelity`` reads a prediction: OTHER's recorded metrics against TRACES', and OTHER's host
speed by the two start-up calibrations (``replay.whatif.fidelity.machine_spread_rows``).
``--target-host`` prices each cell's host work on its own host, measured by its header's
start-up calibration (``replay.whatif.cost.host_speed``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SHARED = ["--temperature", "0.6"]
# Family -> the `replayllm workload` arguments that make it (traces/workloads/: vendored traces);
# the reference family is DESIGN.md's reference workload itself (all 256 requests at once).
# Sizes: each family's arrivals span seconds (so all cells record in about five minutes on an
# H200) at rates that keep the GPU loaded; traces/matrix/ was recorded from these.
FAMILIES: dict[str, list[str]] = {
    "chat": ["generate", "--num-requests", "600", "--arrivals", "poisson", "--rate", "40",
             "--system-prompts", "8", "--system-prompt-len", "uniform:512,1536",
             "--popularity", "1.0", "--prompt-len", "lognormal:200,0.8",
             "--output-len", "lognormal:180,0.6", "--seed", "1"],
    "bursty": ["generate", "--num-requests", "300", "--arrivals", "gamma", "--rate", "12",
               "--burstiness", "0.25", "--prompt-len", "uniform:2000,6000",
               "--output-len", "uniform:16,64", "--seed", "2"],
    "conversation": ["generate", "--num-requests", "120", "--arrivals", "poisson", "--rate", "8",
                     "--turns", "uniform:2,5", "--think-time", "exponential:1.0",
                     "--prompt-len", "uniform:128,768", "--user-len", "uniform:32,256",
                     "--output-len", "uniform:64,256", "--system-prompts", "4",
                     "--seed", "3"],
    "mooncake": ["import", "traces/workloads/mooncake_synthetic_trace.jsonl", "--format",
                 "mooncake", "--limit", "120", "--time-scale", "0.25", "--max-prompt-len", "8192",
                 "--over-length", "clip", "--seed", "4"],
    "azure-code": ["import", "traces/workloads/AzureLLMInferenceTrace_code.csv", "--format",
                   "azure", "--limit", "400", "--time-scale", "0.05", "--max-prompt-len", "8192",
                   "--over-length", "clip", "--seed", "5"],
}
LONG = {"max_model_len": 8448, "max_num_batched_tokens": 16384}
CONSTRAINED = {"max_num_seqs": 64, "num_kvcache_blocks": 300}
# Cell -> (family, Config overrides). The reference default is recorded three times: the
# run-to-run spread of one cell, stated beside the errors.
CELLS: dict[str, tuple[str, dict[str, Any]]] = {
    "reference-default": ("reference", {}),
    "reference-default-2": ("reference", {}),
    "reference-default-3": ("reference", {}),
    "reference-constrained": ("reference", CONSTRAINED),
    "reference-chunked-2048": ("reference", {"policy": "chunked", "max_num_batched_tokens": 2048}),
    "reference-mns128": ("reference", {"max_num_seqs": 128, "num_kvcache_blocks": 1000}),
    # What `replayllm tune` chose on traces/h200-reference-s4 for ttft_p99 <= 0.5 s and
    # tpot_p50 <= 5.5 ms (docs/BENCHMARKS.md): the recording checks the SLOs are met.
    "reference-tuned": ("reference", {"max_num_seqs": 128}),
    "chat-default": ("chat", {}),
    "chat-constrained": ("chat", CONSTRAINED),
    "chat-chunked-512": ("chat", {"policy": "chunked", "max_num_batched_tokens": 512}),
    "bursty-default": ("bursty", LONG),
    "bursty-chunked-2048": ("bursty", {**LONG, "policy": "chunked",
                                       "max_num_batched_tokens": 2048}),
    "conversation-default": ("conversation", {}),
    "conversation-constrained": ("conversation", {"max_num_seqs": 32, "num_kvcache_blocks": 120}),
    "mooncake-default": ("mooncake", LONG),
    "azure-code-default": ("azure-code", LONG),
}


def workload_path(directory: Path, family: str) -> Path:
    return directory / f"{family}.jsonl"


def _requests(directory: Path, family: str) -> list[Any]:
    from replay.workloads.builtin import reference_workload
    from replay.workloads.store import read_workload

    if family == "reference":
        return reference_workload()
    return list(read_workload(workload_path(directory, family)))


def prepare(directory: Path) -> int:
    """Write every family's workload file into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for family, args in FAMILIES.items():
        command = [sys.executable, "-m", "replay.cli.main", "workload", *args, *SHARED,
                   "--out", str(workload_path(directory, family))]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        print(f"{family}: {(proc.stdout or proc.stderr).strip().splitlines()[-1:]}")
        if proc.returncode:
            return proc.returncode
    return 0


# The untraced warm-up engines: the default policy's steps, then chunked mixed steps with a
# range of prefill chunks and decode rows (a mixed step's first shapes compile kernels for
# 0.4 s each in the process: recorded cells must not pay that).
WARMUP: tuple[dict[str, Any], ...] = ({}, {"policy": "chunked", "max_num_batched_tokens": 512},
                                      {"policy": "chunked", "max_num_batched_tokens": 2048})


def warm_up_engines(model: str | Path) -> None:
    """Run ``WARMUP``'s untraced engines over the reference's first 64 requests, so that the
    process's recordings after them compile and load nothing."""
    from engine import LLM
    from replay.cli.live import run_workload
    from replay.workloads.builtin import reference_workload

    requests = reference_workload()[:64]
    for overrides in WARMUP:
        warm = LLM(str(model), record_events=False, **overrides)
        run_workload(warm, requests, use_tqdm=False)
        warm.close()


def recording_names(name: str, repeat: int) -> list[str]:
    """The trace names of ``repeat`` recordings of one cell: ``CELL``, ``CELL-r2``, ..."""
    from replay.whatif.fidelity import REPEAT_MARK

    return [name] + [f"{name}{REPEAT_MARK}{i}" for i in range(2, repeat + 1)]


def record(model: Path, directory: Path, out: Path, only: list[str] | None = None,
           repeat: int = 1) -> int:
    """Record every cell (or those named) ``repeat`` times into ``out/CELL`` (``out/CELL-rN``
    for the repeats), each by a fresh engine."""
    from engine import LLM
    from replay.cli.live import run_workload

    cells = {name: cell for name, cell in CELLS.items() if not only or name in only}
    warm_up_engines(model)
    for base, (family, overrides) in cells.items():
        for name in recording_names(base, repeat):
            _record_one(LLM, run_workload, model, out / name, _requests(directory, family),
                        overrides)
    return 0


def _record_one(llm_class: Any, run_workload: Any, model: Path, trace: Path,
                requests: list[Any], overrides: dict[str, Any]) -> None:
    """One recording by a fresh engine; a line saying what it did."""
    began = time.perf_counter()
    llm = llm_class(str(model), trace_dir=str(trace), **overrides)
    built = time.perf_counter()
    try:
        run_workload(llm, requests, use_tqdm=False)
    finally:
        summary = llm.close()
    print(f"{trace.name}: {len(requests)} requests, {summary['steps']} steps, "
          f"{summary['completion_tokens']} tokens, {summary['preemptions']} preemptions, "
          f"engine {built - began:.1f} s, run {time.perf_counter() - built:.1f} s", flush=True)


def _targets(traces: Path) -> list[str]:
    """The recorded cells under ``traces``, in ``CELLS`` order, repeats after their cell."""
    found = []
    for name in CELLS:
        found += [str(traces / n) for n in recording_names(name, 9) if (traces / n).is_dir()]
    return found


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user's error (an incomplete source, an unreadable trace) is one line on
    stderr and exit 2."""
    from engine.errors import ReplayLLMError
    from tracing.errors import TraceError, one_line

    try:
        return _main(argv)
    except (ReplayLLMError, TraceError) as exc:
        print(f"python -m benchmarks.matrix: error: {one_line(exc)}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.matrix",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    r = sub.add_parser("record")
    r.add_argument("model", type=Path)
    r.add_argument("dir", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--only", nargs="*", default=None)
    r.add_argument("--repeat", type=int, default=1, help="recordings of each cell")
    spread = sub.add_parser("spread")
    spread.add_argument("traces", type=Path)
    spread.add_argument("other", type=Path)
    spread.add_argument("--summary", action="store_true")
    for command in ("fidelity", "ablation", "steps", "drift", "waits"):
        f = sub.add_parser(command)
        f.add_argument("traces", type=Path)
        f.add_argument("--source", required=True)
        f.add_argument("--profile", default=None)
        f.add_argument("--cost-option", dest="cost_options", action="append", default=[],
                       metavar="NAME=VALUE", help="replay.whatif.cost.options.CostOptions")
        f.add_argument("--only", nargs="*", default=None, help="only these cells")
        f.add_argument("--summary", action="store_true",
                       help="fidelity: also the mean absolute errors and misses, one row")
        f.add_argument("--target-host", action="store_true",
                       help="price each cell's host work on its own host, measured by its "
                            "header's start-up calibration (replay.whatif.cost.host_speed)")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(args.dir)
    if args.command == "record":
        return record(args.model, args.dir, args.out, args.only, max(args.repeat, 1))
    targets = _targets(args.traces)
    if getattr(args, "only", None):
        targets = [t for t in targets if Path(t).name in args.only]
    if args.command == "spread":
        return machine_spread(targets, args.other, args.summary)
    from replay.whatif.cost.options import CostOptions

    options = CostOptions.parse(args.cost_options)
    if args.command in ("steps", "drift", "waits"):
        return steps(targets, args.source, args.profile, options, args.target_host,
                     study=args.command)
    if args.command == "ablation":
        return ablation(targets, args.source, args.profile, options, args.target_host)
    from replay.whatif.fidelity import MATRIX_TARGETS, matrix_markdown, matrix_rows
    from replay.whatif.matrix_study import ablation_markdown, ablation_summary

    rows = matrix_rows(targets, args.source, args.profile, options, args.target_host)
    print(matrix_markdown(rows))
    if args.summary:
        name = "each cell on its own host" if args.target_host else "on the source's host"
        print("\n" + ablation_markdown({name: ablation_summary(rows, MATRIX_TARGETS)},
                                       MATRIX_TARGETS))
    return 0


def machine_spread(targets: list[str], other: Path, summary: bool = False) -> int:
    """Print the spread between two device calls: each cell of ``targets`` recorded in
    ``other`` too, against the first recording (``machine_spread_rows``); ``summary``: also
    the mean absolute differences and how many exceed the targets."""
    from replay.whatif.fidelity import MATRIX_TARGETS, machine_spread_rows, matrix_markdown
    from replay.whatif.matrix_study import ablation_markdown, ablation_summary

    pairs = [(t, str(other / Path(t).name)) for t in targets if (other / Path(t).name).is_dir()]
    rows = machine_spread_rows(pairs)
    print(matrix_markdown(rows, host_label="host (calibrations)"))
    if summary:
        as_errors = [{**r, "kind": "prediction"} for r in rows]
        print("\n" + ablation_markdown({f"{other.name} against {Path(targets[0]).parent.name}":
                                        ablation_summary(as_errors, MATRIX_TARGETS)},
                                       MATRIX_TARGETS))
    return 0


def steps(targets: list[str], source: str, profile: str | None, options: Any,
          target_host: bool = False, study: str = "steps") -> int:
    """Print each cell's recorded steps priced by the model, per class (``step_errors``), with
    ``study="drift"`` per span of wall time (``host_drift``), with ``"waits"`` its TTFT split
    into the queue and the rest, recorded against predicted (``request_waits``)."""
    from replay.recorded import from_trace
    from replay.whatif.cost.model import CostModel
    from replay.whatif.fidelity import check_complete_source
    from replay.whatif.matrix_study import (
        host_drift,
        host_drift_markdown,
        request_waits,
        request_waits_markdown,
        step_errors,
        step_errors_markdown,
    )
    from tracing.reader import read_trace

    study_of, markdown = {"steps": (step_errors, step_errors_markdown),
                          "drift": (host_drift, host_drift_markdown),
                          "waits": (request_waits, request_waits_markdown)}[study]

    source_trace = read_trace(source)
    check_complete_source(source_trace, source)
    model = CostModel.fit(from_trace(source_trace), source=source, profile=profile,
                          options=options)
    cells = {}
    for target in targets:
        events = from_trace(read_trace(target))
        priced = (model.on_host(events.header.get("calibration") or [], Path(target).name)
                  if target_host else model)
        cells[Path(target).name] = study_of(priced, events)
    print(markdown(cells))
    return 0


def ablation(targets: list[str], source: str, profile: str | None, options: Any,
             target_host: bool = False) -> int:
    """Print the matrix's errors summed up once per mechanism switched off."""
    from replay.whatif.fidelity import MATRIX_TARGETS, matrix_rows
    from replay.whatif.matrix_study import ablation_markdown, ablation_summary, ablation_variants

    results = {}
    for name, variant in ablation_variants(options, profile is not None).items():
        rows = matrix_rows(targets, source, profile if variant is not None else None, variant,
                           target_host)
        results[name] = ablation_summary(rows, MATRIX_TARGETS)
        print(f"{name}: {results[name]['misses']} misses", file=sys.stderr, flush=True)
    print(ablation_markdown(results, MATRIX_TARGETS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
