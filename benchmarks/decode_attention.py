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
microseconds per layer and TB/s of KV read, and the device's read ceiling (a kernel that only
streams a buffer of the step's KV size through the SMs) to read them against. With
``--layouts token,head`` every variant is also timed over the same cache laid out head-major
(``[blocks, kv_heads, block_size, dim]`` in memory, so one head's tile of a page is contiguous),
read through the same kernel by its strides; such rows are labelled ``head:``. With ``--orders
row,longest`` every variant is also timed with the rows handed to programs longest context first
(the kernel's ``order``, as the runner stages it); such rows are labelled ``longest:``.

Usage (a CUDA GPU): ``python -m benchmarks.decode_attention --out DIR [--batches 32,64,...]
[--layouts token,head] [--orders row,longest]``.
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


def head_major(cache: Any) -> Any:
    """``cache`` ``[blocks, block_size, kv_heads, dim]`` with the same values, stored head-major:
    a strided view of a ``[blocks, kv_heads, block_size, dim]`` tensor."""
    return cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


def read_ceiling(num_bytes: int) -> dict[str, float]:
    """The rate at which the device streams ``num_bytes`` of bf16 into its SMs (each program
    sums its slice; one float per program written), timed in a graph like the variants."""
    import torch
    import triton
    import triton.language as tl

    from benchmarks.gemm import time_graph

    @triton.jit
    def _read(src, out, n, BLOCK: tl.constexpr, PER_PROGRAM: tl.constexpr):
        start = tl.program_id(0).to(tl.int64) * PER_PROGRAM  # 8 G elements: past int32
        acc = tl.zeros([BLOCK], tl.float32)
        for off in range(start, start + PER_PROGRAM, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            acc += tl.load(src + idx, mask=idx < n, other=0.0).to(tl.float32)
        tl.store(out + tl.program_id(0), tl.sum(acc, 0))

    n = num_bytes // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    rows = []
    for per_program, block, warps in ((1 << 16, 4096, 8), (1 << 18, 4096, 8), (1 << 16, 2048, 4)):
        programs = triton.cdiv(n, per_program)
        out = torch.empty(programs, device="cuda", dtype=torch.float32)

        def call(per_program: int = per_program, block: int = block, warps: int = warps,
                 programs: int = programs, out: Any = out) -> None:
            _read[(programs,)](src, out, n, BLOCK=block, PER_PROGRAM=per_program,
                               num_warps=warps)

        us = time_graph(call, REPLAYS, calls=4)
        rows.append({"per_program": per_program, "block": block, "warps": warps, "us": us,
                     "tb_s": num_bytes / us / 1e6})
    best = min(rows, key=lambda r: r["us"])
    print(f"read ceiling over {num_bytes / 1e9:.2f} GB: {best['tb_s']:.2f} TB/s", flush=True)
    return {"bytes": num_bytes, "best_tb_s": best["tb_s"], "rows": rows}


def run_batch(batch: int, rng: random.Random, layouts: tuple[str, ...] = ("token",),
              orders: tuple[str, ...] = ("row",)) -> dict[str, Any]:
    import torch

    from benchmarks.gemm import time_graph
    from benchmarks.gpu_timing import DTYPE, HEAD_DIM, NUM_HEADS, NUM_KV_HEADS
    from benchmarks.kernels import decode_call, decode_reference, paged_inputs, rel_err
    from engine.model.attention_metadata import rows_longest_first

    lens = engine_decode_lens(batch, rng)
    gen = torch.Generator(device="cuda").manual_seed(batch)
    inp = paged_inputs(lens, gen)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE, generator=gen)
    ref = decode_reference(q, inp, lens)
    kv_bytes = sum(lens) * NUM_KV_HEADS * HEAD_DIM * 2 * q.element_size()
    rows: list[dict[str, Any]] = []
    longest_first = torch.from_numpy(rows_longest_first(lens)).to("cuda", torch.int32)
    cases = []
    for layout, order in itertools.product(layouts, orders):
        cache = inp if layout == "token" else {
            **inp, "k_cache": head_major(inp["k_cache"]), "v_cache": head_major(inp["v_cache"])}
        prefix = "".join(f"{name}:" for name in (layout, order) if name not in ("token", "row"))
        for variant in variants(current_launch(batch, NUM_KV_HEADS), batch, NUM_KV_HEADS):
            cases.append((cache, longest_first if order == "longest" else None,
                          {**variant, "label": prefix + variant["label"]}))
    for cache, order, variant in cases:
        knobs = {k: v for k, v in variant.items() if k != "label"}
        out = torch.full_like(q, float("nan"))
        call = decode_call(q, cache, out, {**knobs, "order": order})

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
    for prefix in [f"{name}:" for name in layouts[1:] + orders[1:]]:
        other = next((r for r in timed if r["label"] == f"{prefix}current"), None)
        if other and current:
            print(f"batch {batch:>3}: {prefix}current {other['us']:7.1f} us "
                  f"{other['tb_s']:.2f} TB/s against {current['us']:.1f}", flush=True)
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
    parser.add_argument("--layouts", default="token",
                        help="comma-separated cache layouts to time: token (the engine's), head")
    parser.add_argument("--orders", default="row",
                        help="comma-separated row orders to time: row (as staged), longest")
    args = parser.parse_args(argv)
    layouts = tuple(args.layouts.split(","))
    orders = tuple(args.orders.split(","))
    if layouts[0] != "token" or not set(layouts) <= {"token", "head"}:
        print("decode_attention: --layouts is token, optionally followed by head", file=sys.stderr)
        return 2
    if orders[0] != "row" or not set(orders) <= {"row", "longest"}:
        print("decode_attention: --orders is row, optionally followed by longest", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("decode_attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    from engine.model.kernels.launch import set_programmatic_launch

    set_programmatic_launch(True, torch.cuda.get_device_capability())
    rng = random.Random(0)
    result = {
        "device": torch.cuda.get_device_name(),
        "read_ceiling": read_ceiling(16 << 30),
        "batches": [run_batch(int(b), rng, layouts, orders) for b in args.batches.split(",")],
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "decode_attention.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
