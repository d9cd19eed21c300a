"""GEMM shapes of a Qwen3-0.6B decode step on the GPU: cuBLAS against cuBLASLt, per batch size.

A decode step at batch M runs, per layer, four GEMMs ``[M, K] x [K, N]`` (fused QKV, attention
output, fused gate/up, down) and once the LM head. At M <= 256 they read each weight once and are
meant to be bandwidth-bound; the profile of the engine showed cuBLAS reaching ~1.1 TB/s there.
This times each shape inside a CUDA graph (20 back-to-back calls, so launch gaps do not count)
under torch's default BLAS library and under cuBLASLt (``torch.backends.cuda.
preferred_blas_library``), and writes ``gemm.json``: microseconds and weight bytes per second.

Usage (a CUDA GPU): ``python -m benchmarks.gemm --out DIR``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

# (name, K, N) of Qwen3-0.6B's projections; the LM head is the tied embedding (vocab x hidden).
SHAPES = (
    ("qkv", 1024, 4096),
    ("o_proj", 2048, 1024),
    ("gate_up", 1024, 6144),
    ("down", 3072, 1024),
    ("lm_head", 1024, 151936),
)
BATCHES = (1, 16, 64, 128, 256)
CALLS_PER_GRAPH = 20
LIBRARIES = ("cublas", "cublaslt")


def time_graph(fn: Any, reps: int = 20, calls: int = CALLS_PER_GRAPH) -> float:
    """Microseconds per call of ``fn``, captured ``calls`` times in one CUDA graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * calls)


def run(out_dir: Path) -> list[dict[str, Any]]:
    import torch

    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, k, n in SHAPES:
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        for m in BATCHES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            row: dict[str, Any] = {"shape": name, "M": m, "K": k, "N": n}
            for library in LIBRARIES:
                try:
                    torch.backends.cuda.preferred_blas_library(library)
                    # What the engine's linear layers call.
                    us = time_graph(functools.partial(torch.nn.functional.linear, x, weight))
                    row[f"{library}_us"] = us
                    row[f"{library}_tb_s"] = weight.numel() * 2 / us / 1e6
                except Exception as exc:  # report and go on: a library may be unavailable
                    row[f"{library}_error"] = f"{type(exc).__name__}: {exc}"
            torch.backends.cuda.preferred_blas_library("default")
            rows.append(row)
            print(
                f"{name:<8} M={m:<4} "
                + "  ".join(
                    f"{lib} {row[lib + '_us']:7.1f} us {row[lib + '_tb_s']:5.2f} TB/s"
                    if lib + "_us" in row
                    else f"{lib} failed"
                    for lib in LIBRARIES
                ),
                flush=True,
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gemm.json").write_text(json.dumps(rows, indent=1))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/gemm")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_gemm: needs a CUDA GPU", file=sys.stderr)
        return 2
    run(Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
