"""The what-if validation matrix: workload families x configurations, recorded on a GPU, each
predicted from one source on any CPU.

    python -m benchmarks.matrix prepare DIR            # the workload files (CPU, seconds)
    python -m benchmarks.matrix record MODEL DIR OUT   # on the GPU: one trace per cell in OUT
    python -m benchmarks.matrix fidelity TRACES --source TRACE [--profile PROFILE]
        [--cost-option NAME=VALUE ...]                 # a mechanism switched (an ablation)

``prepare`` writes each family's workload with the project's own generators and importers;
``record`` runs every cell in one process after an untraced warm-up engine (so every recorded
engine starts warm, as the committed reference does); ``fidelity`` predicts each recorded cell
from the source trace's step-time model (and a device profile, where given) and compares the
prediction with the recording (``replay.whatif.fidelity.matrix_rows``).
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
    # What `replayllm tune` chose on traces/h200-reference for ttft_p99 <= 0.5 s and
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


def record(model: Path, directory: Path, out: Path, only: list[str] | None = None) -> int:
    """Record every cell (or those named) into ``out/CELL``, each by a fresh engine."""
    from engine import LLM
    from replay.cli.live import run_workload

    cells = {name: cell for name, cell in CELLS.items() if not only or name in only}
    warm = LLM(str(model), record_events=False)
    run_workload(warm, _requests(directory, "reference")[:32], use_tqdm=False)
    warm.close()
    for name, (family, overrides) in cells.items():
        requests = _requests(directory, family)
        began = time.perf_counter()
        llm = LLM(str(model), trace_dir=str(out / name), **overrides)
        built = time.perf_counter()
        try:
            run_workload(llm, requests, use_tqdm=False)
        finally:
            summary = llm.close()
        print(f"{name}: {len(requests)} requests, {summary['steps']} steps, "
              f"{summary['completion_tokens']} tokens, {summary['preemptions']} preemptions, "
              f"engine {built - began:.1f} s, run {time.perf_counter() - built:.1f} s",
              flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
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
    f = sub.add_parser("fidelity")
    f.add_argument("traces", type=Path)
    f.add_argument("--source", required=True)
    f.add_argument("--profile", default=None)
    f.add_argument("--cost-option", dest="cost_options", action="append", default=[],
                   metavar="NAME=VALUE", help="replay.whatif.cost.profile.CostOptions")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(args.dir)
    if args.command == "record":
        return record(args.model, args.dir, args.out, args.only)
    from replay.whatif.cost.profile import CostOptions
    from replay.whatif.fidelity import matrix_markdown, matrix_rows

    targets = [str(args.traces / name) for name in CELLS if (args.traces / name).is_dir()]
    options = CostOptions.parse(args.cost_options)
    print(matrix_markdown(matrix_rows(targets, args.source, args.profile, options)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
