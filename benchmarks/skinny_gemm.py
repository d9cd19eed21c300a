"""Decode-sized GEMMs with their consumers: cuBLAS against the split-K Triton kernel, per tiling.

Each of Qwen3-0.6B's four projections is timed as a decode step runs it, with what consumes its
output, over 28 distinct weights (one per layer, 28 x 4-12 MB is more than the L2 cache, so
weights come from HBM as they do in the engine), inside a CUDA graph:

- ``o_proj`` / ``down``: GEMM + residual add + RMSNorm; ``down`` also the SwiGLU before it.
  cuBLAS: ``F.linear`` (+ ``silu_and_mul``) + ``rms_norm``; split-K: ``splitk_linear`` (SwiGLU
  inside) + ``rms_norm_of_parts``.
- ``qkv`` / ``gate_up``: the GEMM alone (one split: its output is a plain tensor).

Every tiling that fits is checked against cuBLAS's output (relative error) before it is timed.
Writes ``skinny_gemm.json`` with microseconds per layer and the best tiling per shape and batch.

Usage (a CUDA GPU): ``python -m benchmarks.skinny_gemm --out DIR [--batches 1,16,64,128,256]``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.nn.functional as F

from benchmarks.gemm import SHAPES, time_graph

LAYERS = 28
REPLAYS = 30
MAX_REL_ERR = 2e-2
EPS = 1e-6


def candidate_tilings(m: int, n: int, k: int, split_ok: bool) -> list[Any]:
    """Tilings worth timing for one product: programs between half the SMs and ~8 waves."""
    from engine.model.layers.decode_gemm import SplitKTiling

    out = []
    for bn, bm, (bk, stages), split in itertools.product(
        (32, 64, 128), (16, 32, 64, 128), ((64, 4), (128, 3), (256, 2)), (1, 2, 3, 4, 8)
    ):
        if bn == 32 and (split > 1 or bm > 32):
            continue  # narrow tiles only where K is not split (qkv, gate_up at small batches)
        warps = 4 if bn * bm <= 64 * 64 else 8
        tiling = SplitKTiling(bn, bm, bk, split, warps, stages)
        if not tiling.fits(m, n, k) or (split > 1 and not split_ok):
            continue
        if bm > max(16, 1 << (m - 1).bit_length()):
            continue  # no tile wider than the (padded) batch
        programs = (n // bn) * -(-m // bm) * split
        if 64 <= programs <= 700:
            out.append(tiling)
    return out


def rel_err(out: Any, ref: Any) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@dataclass
class Case:
    """One projection at one batch size over ``LAYERS`` weights, with its consumer."""

    weights: list[Any]
    x: Any
    residual: Any
    norm_weight: Any
    consumer: bool  # a residual add + RMSNorm reads the output (o_proj, down)
    swiglu: bool  # the input is [gate | up] and SwiGLU precedes the GEMM (down)

    def cublas(self) -> Any:
        from engine.model.kernels import fused

        out = None
        for w in self.weights:
            a = fused.silu_and_mul(self.x) if self.swiglu else self.x
            y = F.linear(a, w)
            out = fused.rms_norm(y, self.norm_weight, EPS, self.residual) if self.consumer else y
        return out

    def split_k(self, tiling: Any) -> Any:
        from engine.model.kernels import fused
        from engine.model.kernels.skinny_gemm import splitk_linear

        out = None
        for w in self.weights:
            y = splitk_linear(self.x, w, tiling, silu_mul=self.swiglu)
            if not self.consumer:
                out = y
            elif tiling.split_k > 1:
                out = fused.rms_norm_of_parts(y, self.norm_weight, EPS, self.residual)
            else:
                out = fused.rms_norm(y, self.norm_weight, EPS, self.residual)
        return out

    def first(self, out: Any) -> Any:
        return out[0] if self.consumer else out


def time_tilings(case: Case, tilings: list[Any], ref: Any) -> list[dict[str, Any]]:
    """Each tiling checked against ``ref`` (cuBLAS's output), then timed; failures reported."""
    results: list[dict[str, Any]] = []
    for tiling in tilings:
        fn = functools.partial(case.split_k, tiling)
        try:
            err = rel_err(case.first(fn()), ref)
            if err > MAX_REL_ERR:
                results.append({"tiling": tiling.label(), "error": f"rel err {err:.3g}"})
                continue
            us = time_graph(fn, REPLAYS, calls=1) / LAYERS
        except Exception as exc:  # noqa: BLE001 - a tiling may not compile: report it
            results.append({"tiling": tiling.label(), "error": f"{type(exc).__name__}"})
            continue
        results.append({"tiling": tiling.label(), "us": us, "rel_err": err, **vars(tiling)})
    return results


def run(out_dir: Path, batches: list[int]) -> dict[str, Any]:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    dev, bf16 = "cuda", torch.bfloat16
    rows: list[dict[str, Any]] = []
    best: dict[str, Any] = {}
    norm_w = (1 + 0.1 * torch.randn(1024, device=dev, generator=gen)).to(bf16)
    for name, k, n in SHAPES:
        if name == "lm_head":
            continue
        weights = [
            (torch.randn(n, k, device=dev, generator=gen) * k**-0.5).to(bf16) for _ in range(LAYERS)
        ]
        for m in batches:
            swiglu = name == "down"
            case = Case(
                weights,
                torch.randn(m, 2 * k if swiglu else k, device=dev, generator=gen).to(bf16),
                torch.randn(m, n, device=dev, generator=gen).to(bf16),
                norm_w,
                consumer=name in ("o_proj", "down"),
                swiglu=swiglu,
            )
            ref = case.first(case.cublas())
            base_us = time_graph(case.cublas, REPLAYS, calls=1) / LAYERS
            row: dict[str, Any] = {"shape": name, "M": m, "K": k, "N": n, "cublas_us": base_us}
            results = time_tilings(case, candidate_tilings(m, n, k, case.consumer), ref)
            timed = [r for r in results if "us" in r]
            row["tried"] = len(results)
            row["failed"] = len(results) - len(timed)
            if timed:
                top = min(timed, key=lambda r: r["us"])
                row.update(best_us=top["us"], best=top["tiling"], best_rel_err=top["rel_err"])
                row["speedup"] = base_us / top["us"]
                best[f"{name}/{m}"] = top
                row["top5"] = sorted(timed, key=lambda r: r["us"])[:5]
            rows.append(row)
            print(
                f"{name:<8} M={m:<4} cublas {base_us:6.2f} us"
                + (
                    f"  best {row['best_us']:6.2f} us x{row['speedup']:.2f} {row['best']}"
                    f" (err {row['best_rel_err']:.1e}, {len(timed)}/{len(results)} ok)"
                    if timed
                    else "  no tiling ran"
                ),
                flush=True,
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"rows": rows, "best": best, "device": torch.cuda.get_device_name()}
    (out_dir / "skinny_gemm.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/skinny_gemm")
    parser.add_argument("--batches", default="1,16,64,128,256")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("skinny_gemm: needs a CUDA GPU", file=sys.stderr)
        return 2
    run(Path(args.out), [int(b) for b in args.batches.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
