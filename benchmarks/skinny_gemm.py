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

``--pdl`` launches the Triton kernels as the engine does under ``Config.programmatic_launch``;
``--prefetch`` times each tiling also with its weight slice prefetched into L2 before the wait
for the kernel before it (``SplitKTiling.prefetch``), the best ones only (``--refine``).
``--layer`` then times the projections of a decode layer in order (input norm, qkv, o_proj +
norm, gate_up, down + norm; attention left out) over the 28 layers: cuBLAS for all four, the
engine's choice today (``DECODE_TILINGS``), and the best Triton tiling of each shape at that
batch with and without prefetch.

Usage (a CUDA GPU): ``python -m benchmarks.skinny_gemm --out DIR [--batches 1,16,64,128,256]
[--pdl] [--prefetch] [--layer]``.
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

HIDDEN = 1024
# Launches worth timing: from a quarter of the SMs (at 256 rows an unsplit tile is wide) to ~5
# waves.
MIN_PROGRAMS, MAX_PROGRAMS = 32, 700

LAYERS = 28
REPLAYS = 30
MAX_REL_ERR = 2e-2
EPS = 1e-6


def candidate_tilings(m: int, n: int, k: int, split_ok: bool) -> list[Any]:
    """Tilings worth timing for one product (``MIN_PROGRAMS`` to ``MAX_PROGRAMS`` programs)."""
    from engine.model.layers.decode_gemm import SplitKTiling

    out = []
    for bn, bm, (bk, stages), split in itertools.product(
        (32, 64, 128), (16, 32, 64, 128), ((64, 4), (128, 3)), (1, 2, 4, 8)
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
        if MIN_PROGRAMS <= programs <= MAX_PROGRAMS:
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


def with_prefetch(tilings: list[Any]) -> list[Any]:
    """Each tiling again with its weights prefetched (``SplitKTiling.prefetch``)."""
    import dataclasses

    return [dataclasses.replace(t, prefetch=True) for t in tilings]


def run(
    out_dir: Path,
    batches: list[int],
    prefetch: bool = False,
    refine: int = 4,
    layer: bool = False,
) -> dict[str, Any]:
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
            if prefetch:  # the best few again, beside their prefetching form (same graph state)
                plain = sorted((r for r in results if "us" in r), key=lambda r: r["us"])[:refine]
                again = [tiling_of(r) for r in plain]
                results = [r for r in results if "us" not in r] + time_tilings(
                    case, again + with_prefetch(again), ref
                )
            timed = [r for r in results if "us" in r]
            row["tried"] = len(results)
            row["failed"] = len(results) - len(timed)
            if timed:
                top = min(timed, key=lambda r: r["us"])
                row.update(best_us=top["us"], best=top["tiling"], best_rel_err=top["rel_err"])
                row["speedup"] = base_us / top["us"]
                best[f"{name}/{m}"] = top
                row["top5"] = sorted(timed, key=lambda r: r["us"])[:5]
                row["best_by_kind"] = best_by_kind(timed)  # the layer chain's picks
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
    layers = []
    if layer:
        for m in batches:
            picks = {
                "plain": {n: tiling_of(r) for n, r in best_of(rows, m, prefetch=False).items()},
                "prefetch": {n: tiling_of(r) for n, r in best_of(rows, m, prefetch=True).items()},
            }
            row = time_layer(m, gen, picks)
            layers.append(row)
            print(
                f"layer M={m:<4} "
                + "  ".join(f"{k} {v:6.2f}" for k, v in row.items() if k.endswith("_us")),
                flush=True,
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "rows": rows,
        "best": best,
        "layers": layers,
        "pdl": programmatic(),
        "device": torch.cuda.get_device_name(),
    }
    (out_dir / "skinny_gemm.json").write_text(json.dumps(result, indent=1))
    return result


def tiling_of(result: dict[str, Any]) -> Any:
    """The :class:`SplitKTiling` a timing row was made with."""
    import dataclasses

    from engine.model.layers.decode_gemm import SplitKTiling

    return SplitKTiling(**{f.name: result[f.name] for f in dataclasses.fields(SplitKTiling)})


def best_by_kind(timed: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The fastest timing row without prefetch (``plain``) and with it (``prefetch``), of the
    kinds that were timed."""
    kinds = {"plain": False, "prefetch": True}
    return {
        kind: min(of_kind, key=lambda r: r["us"])
        for kind, fetched in kinds.items()
        if (of_kind := [r for r in timed if bool(r.get("prefetch")) == fetched])
    }


def best_of(rows: list[dict[str, Any]], m: int, prefetch: bool) -> dict[str, dict[str, Any]]:
    """Per shape, the fastest timed tiling at batch ``m`` with (or without) prefetch."""
    kind = "prefetch" if prefetch else "plain"
    return {
        row["shape"]: row["best_by_kind"][kind]
        for row in rows
        if row["M"] == m and kind in row.get("best_by_kind", {})
    }


def programmatic() -> bool:
    from engine.model.kernels.launch import programmatic_launch

    return programmatic_launch()


def time_layer(m: int, gen: Any, picks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A decode layer's projections and norms over ``LAYERS`` layers (attention left out), us a
    layer: cuBLAS throughout, the engine's split-K buckets (``DecodeGemm``), and the given
    Triton tilings per shape (``picks[variant][shape]``; a shape without one keeps cuBLAS)."""
    import torch

    from engine.model.kernels import fused, skinny_gemm
    from engine.model.layers.decode_gemm import DecodeGemm

    dev, bf16 = "cuda", torch.bfloat16
    shapes = {name: (k, n) for name, k, n in SHAPES if name != "lm_head"}
    weights = {
        name: [
            (torch.randn(n, k, device=dev, generator=gen) * k**-0.5).to(bf16) for _ in range(LAYERS)
        ]
        for name, (k, n) in shapes.items()
    }
    norm_w = (1 + 0.1 * torch.randn(HIDDEN, device=dev, generator=gen)).to(bf16)
    hidden0 = torch.randn(m, HIDDEN, device=dev, generator=gen).to(bf16)
    residual0 = torch.randn(m, HIDDEN, device=dev, generator=gen).to(bf16)
    attn_out = torch.randn(m, shapes["o_proj"][0], device=dev, generator=gen).to(bf16)
    engine_gemm = {role: DecodeGemm(skinny_gemm, role) for role in ("o_proj", "down")}

    def project(choice: dict[str, Any] | None, name: str, x: Any, layer: int, swiglu: bool) -> Any:
        w = weights[name][layer]
        if choice is None:  # the engine's buckets for o_proj/down, cuBLAS otherwise
            gemm = engine_gemm.get(name)
            parts = gemm.project(x, w, silu_mul=swiglu) if gemm is not None else None
            if parts is not None:
                return parts.parts
        elif name in choice:
            return skinny_gemm.splitk_linear(x, w, choice[name], silu_mul=swiglu)
        return F.linear(fused.silu_and_mul(x) if swiglu else x, w)

    def norm(y: Any, residual: Any) -> tuple[Any, Any]:
        if y.dtype == torch.float32:  # split-K partials
            return fused.rms_norm_of_parts(y, norm_w, EPS, residual)
        return fused.rms_norm(y, norm_w, EPS, residual)

    def layers(choice: dict[str, Any] | None) -> Any:
        y, residual = hidden0, residual0
        for layer in range(LAYERS):
            h, residual = norm(y, residual)
            project(choice, "qkv", h, layer, False)
            h, residual = norm(project(choice, "o_proj", attn_out, layer, False), residual)
            gate_up = project(choice, "gate_up", h, layer, False)
            y = project(choice, "down", gate_up, layer, True)
        return norm(y, residual)[0]

    variants: dict[str, Any] = {"cublas": {}, "engine": None, **picks}
    ref = layers({})
    row: dict[str, Any] = {"M": m}
    for label, choice in variants.items():
        fn = functools.partial(layers, choice)
        row[f"{label}_rel_err"] = rel_err(fn(), ref)
        row[f"{label}_us"] = time_graph(fn, REPLAYS, calls=1) / LAYERS
        if choice:
            row[f"{label}_tilings"] = {k: v.label() for k, v in choice.items()}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/skinny_gemm")
    parser.add_argument("--batches", default="1,16,64,128,256")
    parser.add_argument("--pdl", action="store_true", help="programmatic dependent launch")
    parser.add_argument("--prefetch", action="store_true", help="also weights prefetched to L2")
    parser.add_argument("--refine", type=int, default=4, help="best tilings re-timed with prefetch")
    parser.add_argument("--layer", action="store_true", help="a decode layer's projections")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("skinny_gemm: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.pdl:
        from engine.model.kernels.launch import set_programmatic_launch

        set_programmatic_launch(True, torch.cuda.get_device_capability())
    batches = [int(b) for b in args.batches.split(",")]
    run(Path(args.out), batches, args.prefetch, args.refine, args.layer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
