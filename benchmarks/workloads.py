"""Workload scale benchmark: generate, import and read a 1,000,000-request workload, streaming.

Each phase runs in a fresh process so its peak RSS (``ru_maxrss``) is its own:

- ``generate``: ``replay.workloads.generate`` (Poisson arrivals, lognormal lengths, 8 shared
  system prompts) written to Parquet;
- ``import``: an Azure-2023-format CSV of the same size (written first, not timed) imported to
  Parquet with a prompt clip (``replay.workloads.imports``);
- ``read``: the generated Parquet read back, every request validated.

Run: ``.venv/bin/python -m benchmarks.workloads [--requests N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DEFAULT_REQUESTS = 1_000_000
CSV_CHUNK = 100_000


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _write_azure_csv(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    start = np.datetime64("2023-11-16T18:17:03.9799600")
    offset = 0.0
    with open(path, "w") as out:
        out.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for first in range(0, n, CSV_CHUNK):
            size = min(CSV_CHUNK, n - first)
            times = offset + np.cumsum(rng.exponential(0.01, size))
            offset = float(times[-1])
            stamps = start + (times * 1e7).astype("timedelta64[100ns]")
            text = np.datetime_as_string(stamps, unit="us")
            prompt = rng.integers(3, 8000, size)
            output = rng.integers(0, 500, size)
            out.writelines(f"{t.replace('T', ' ')}0,{p},{o}\n"
                           for t, p, o in zip(text, prompt, output))


def _phase(name: str, n: int, work: Path) -> dict:
    began = time.perf_counter()
    if name == "generate":
        from replay.workloads.arrivals import ArrivalProcess
        from replay.workloads.distributions import parse
        from replay.workloads.generate import GenerateSpec, Generator
        from replay.workloads.store import WorkloadWriter

        out = work / "generated.parquet"
        spec = GenerateSpec(num_requests=n, arrivals=ArrivalProcess("poisson", 100.0),
                            prompt_len=parse("lognormal:800,1"),
                            output_len=parse("lognormal:200,1"), system_prompts=8)
        writer = WorkloadWriter(out)
        count = writer.write_all(Generator(spec))
        writer.close()
    elif name == "import":
        from replay.workloads.import_options import ImportCounts, ImportOptions
        from replay.workloads.imports import import_workload
        from replay.workloads.store import WorkloadWriter

        out = work / "imported.parquet"
        counts = ImportCounts()
        writer = WorkloadWriter(out)
        count = writer.write_all(import_workload(work / "azure.csv", "azure",
                                                 ImportOptions(max_prompt_len=4096,
                                                               over_length="clip"), counts))
        writer.close({"imported": counts.to_dict()})
    else:
        from replay.workloads.store import read_workload

        out = work / "generated.parquet"
        count = sum(1 for _ in read_workload(out))
    seconds = time.perf_counter() - began
    return {"phase": name, "requests": count, "seconds": round(seconds, 2),
            "requests_per_s": round(count / seconds), "peak_rss_mb": round(_peak_rss_mb(), 1),
            "file_mb": round(out.stat().st_size / 2**20, 1), "file": out.name}


def main(json_path: str | None = None, requests: int = DEFAULT_REQUESTS) -> int:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        began = time.perf_counter()
        _write_azure_csv(work / "azure.csv", requests)
        csv_mb = (work / "azure.csv").stat().st_size / 2**20
        print(f"wrote the {requests:,}-row Azure-format CSV ({csv_mb:.1f} MB) in "
              f"{time.perf_counter() - began:.1f} s (setup, not timed)")
        for phase in ("generate", "import", "read"):
            done = subprocess.run([sys.executable, "-m", "benchmarks.workloads", "--phase", phase,
                                   "--requests", str(requests), "--work", str(work)],
                                  check=True, capture_output=True, text=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(result)
            print(f"{phase:>9}: {result['requests']:,} requests in {result['seconds']} s "
                  f"({result['requests_per_s']:,} req/s), peak RSS {result['peak_rss_mb']} MB, "
                  f"{result['file']} {result['file_mb']} MB")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS)
    parser.add_argument("--json", default=None)
    parser.add_argument("--phase", choices=["generate", "import", "read"], help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(_phase(args.phase, args.requests, Path(args.work))))
        sys.exit(0)
    sys.exit(main(args.json, args.requests))
