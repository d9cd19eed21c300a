"""Shared by the kernel benchmarks: Qwen3-0.6B attention shapes and GPU timing helpers.

``benchmarks.kernels``, ``benchmarks.sampler`` and ``benchmarks.store`` import these; none of
them imports another.
"""

from __future__ import annotations

from typing import Any

import torch

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 256
DTYPE = torch.bfloat16


def bench_ms(fn: Any, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median milliseconds per call of ``fn`` (``triton.testing.do_bench``, CUDA events)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def time_call(fn: Any) -> dict[str, float]:
    """GPU time per call: CUDA graph replay (no launch overhead) and eager (``do_bench``)."""
    import triton.testing

    res: dict[str, float] = {}
    try:
        res["us_graph"] = 1e3 * float(
            triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median")
        )
    except Exception as exc:  # noqa: BLE001 - report and fall back to eager timing
        res["graph_error"] = f"{type(exc).__name__}: {exc}"[:200]  # type: ignore[assignment]
        torch.cuda.synchronize()
    res["us_eager"] = 1e3 * bench_ms(fn)
    return res
