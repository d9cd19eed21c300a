"""Decode attention as a decode step runs it: per batch size, split counts and tilings, in a graph.

``benchmarks.kernels`` times one eager launch; at mid batch sizes (32-192 sequences, most of the
reference workload's decode steps) a launch is short enough for its ramp and tail to matter, so
here each variant is captured ``LAYERS`` times in one CUDA graph, as the model replays it, with
programmatic dependent launch as the engine sets it. Contexts are spread as the reference
workload's survivors have them when its batch has shrunk to that size (a decode batch of ``b``
sequences comes ~``100 + 924 (1 - b/256)`` steps in, each context a prompt of 100-1,024 tokens
plus those steps). Every variant is checked against a float32 reference first.

Writes ``decode_attention.json``: per batch, the engine's current choice
(``engine.attention_splits.choose_num_splits`` and the kernel's defaults) and every variant, with
microseconds per layer and TB/s of KV read.

Usage (a CUDA GPU): ``python -m benchmarks.decode_attention --out DIR [--batches 32,64,...]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from pathlib import Path
from typing import Any

LAYERS = 28
REPLAYS = 10
BF16_TOLERANCE = 1e-2


def engine_decode_lens(batch: int, rng: random.Random) -> list[int]:
    """Contexts of the reference workload's decode batch once it has shrunk to ``batch``."""
    steps_in = int(100 + 924 * (1 - batch / 256))
    return [rng.randint(100, 1024) + steps_in for _ in range(batch)]


def current_launch(batch: int, num_kv_heads: int) -> dict[str, int]:
    """The engine's launch for a decode of ``batch`` rows: its split rule and the kernel's
    default tiling."""
    from engine.attention_splits import choose_num_splits
    from engine.model.kernels import paged_attention as pa

    return {
        "num_splits": choose_num_splits(batch, num_kv_heads),
        "block_n": pa.DECODE_BLOCK_N,
        "num_warps": pa.DECODE_NUM_WARPS,
        "num_stages": pa.DECODE_NUM_STAGES,
    }


def variants(current: dict[str, int], batch: int, num_kv_heads: int) -> list[dict[str, Any]]:
    """``current`` (the engine's launch) first, then split counts x tilings around it."""
    out: list[dict[str, Any]] = [{"label": "current", **current}]
    tilings = [
        (32, 2, 4),
        (32, 3, 4),
        (32, 4, 4),
        (64, 2, 4),
        (64, 3, 4),
        (64, 4, 4),
        (128, 2, 4),
        (128, 2, 8),
        (128, 3, 8),
    ]  # (block_n, stages, warps)
    for splits, (block_n, stages, warps) in itertools.product((1, 2, 4, 8, 16), tilings):
        if batch * num_kv_heads * splits > 16384:
            continue
        v = {"num_splits": splits, "block_n": block_n, "num_warps": warps, "num_stages": stages}
        if v != current:
            out.append({"label": f"s{splits}n{block_n}p{stages}w{warps}", **v})
    return out


def run_batch(batch: int, rng: random.Random) -> dict[str, Any]:
    import torch

    from benchmarks.gemm import time_graph
    from benchmarks.gpu_timing import DTYPE, HEAD_DIM, NUM_HEADS, NUM_KV_HEADS
    from benchmarks.kernels import decode_call, decode_reference, paged_inputs, rel_err

    lens = engine_decode_lens(batch, rng)
    gen = torch.Generator(device="cuda").manual_seed(batch)
    inp = paged_inputs(lens, gen)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE, generator=gen)
    ref = decode_reference(q, inp, lens)
    kv_bytes = sum(lens) * NUM_KV_HEADS * HEAD_DIM * 2 * q.element_size()
    rows: list[dict[str, Any]] = []
    for variant in variants(current_launch(batch, NUM_KV_HEADS), batch, NUM_KV_HEADS):
        knobs = {k: v for k, v in variant.items() if k != "label"}
        out = torch.full_like(q, float("nan"))
        call = decode_call(q, inp, out, knobs)

        try:
            call()
            torch.cuda.synchronize()
            err = rel_err(out, ref)
            if not err < BF16_TOLERANCE:
                rows.append({**variant, "error": f"rel err {err:.3g}"})
                continue
            us = time_graph(call, REPLAYS, calls=LAYERS)
        except Exception as exc:  # noqa: BLE001 - a tiling may not compile or fit: report it
            rows.append({**variant, "error": type(exc).__name__})
            continue
        rows.append({**variant, "us": us, "tb_s": kv_bytes / us / 1e6, "rel_err": err})
    timed = [r for r in rows if "us" in r]
    best = min(timed, key=lambda r: r["us"]) if timed else None
    current = next((r for r in timed if r["label"] == "current"), None)
    summary = {
        "batch": batch,
        "mean_ctx": sum(lens) / batch,
        "kv_mb": kv_bytes / 1e6,
        "current": current,
        "best": best,
        "rows": rows,
    }
    if best and current:
        print(
            f"batch {batch:>3} ctx {summary['mean_ctx']:6.0f}: current {current['us']:7.1f} us "
            f"{current['tb_s']:.2f} TB/s (s{current['num_splits']}) | best {best['us']:7.1f} us "
            f"{best['tb_s']:.2f} TB/s {best['label']} | "
            + ", ".join(
                f"{r['label']} {r['us']:.1f}" for r in sorted(timed, key=lambda r: r["us"])[1:5]
            ),
            flush=True,
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/decode_attention")
    parser.add_argument("--batches", default="16,32,64,96,128,160,192,224,256")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("decode_attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    from engine.model.kernels.launch import set_programmatic_launch

    set_programmatic_launch(True, torch.cuda.get_device_capability())
    rng = random.Random(0)
    result = {
        "device": torch.cuda.get_device_name(),
        "batches": [run_batch(int(b), rng) for b in args.batches.split(",")],
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "decode_attention.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
