"""Check and time the engine's Triton kernels on a CUDA device, several variants in one run.

``python -m benchmarks.kernels --out DIR`` measures the copy-bandwidth ceiling, then for
decode attention (Qwen3-0.6B shapes, bf16, 256-token pages) and prefill attention times each
variant with CUDA events (median of ``triton.testing.do_bench``), checks its output against a
float32 PyTorch reference on the same inputs, and writes ``kernels.json`` plus a short table.
Figures are per layer; a decode step of the whole model is 28 of these. The store kernels'
section is :mod:`benchmarks.store`.

The GPU sampler section (``sampler.json``) is :mod:`benchmarks.sampler`; ``--only sampler``
runs just that one.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.gpu_timing import BLOCK_SIZE, DTYPE, HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, bench_ms

COPY_BYTES = 2 << 30
BF16_TOLERANCE = 1e-2  # relative error of bf16-operand attention against a float32 reference
REF_MEAN_CONTEXT = 850  # the reference workload's mean decode context, about


def copy_ceiling() -> dict[str, float]:
    src = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return {"copy_ms": ms, "copy_tb_s": 2 * COPY_BYTES / ms / 1e9}


def paged_inputs(lens: list[int], gen: torch.Generator) -> dict[str, Any]:
    """Random caches with shuffled pages; the tables name every sequence's pages."""
    needed = [math.ceil(n / BLOCK_SIZE) for n in lens]
    num_blocks = sum(needed) + 8
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, device="cuda", dtype=DTYPE, generator=gen)
    v_cache = torch.randn(shape, device="cuda", dtype=DTYPE, generator=gen)
    order = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
    width = max(needed) + 1
    tables = torch.full((len(lens), width), -1, dtype=torch.int32, device="cuda")
    used = 0
    for i, n in enumerate(needed):
        tables[i, :n] = order[used : used + n]
        used += n
    return {
        "k_cache": k_cache,
        "v_cache": v_cache,
        "tables": tables,
        "lens": torch.tensor(lens, dtype=torch.int32, device="cuda"),
    }


def gather_seq(cache: torch.Tensor, table: torch.Tensor, ctx: int) -> torch.Tensor:
    """One sequence's first ``ctx`` cache rows, contiguous: ``[ctx, kv_heads, dim]``."""
    return cache[table[: math.ceil(ctx / BLOCK_SIZE)].long()].flatten(0, 1)[:ctx]


def decode_reference(q: torch.Tensor, inp: dict[str, Any], lens: list[int]) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32, device="cuda")
    for i, ctx in enumerate(lens):
        keys = gather_seq(inp["k_cache"], inp["tables"][i], ctx).float().transpose(0, 1)
        values = gather_seq(inp["v_cache"], inp["tables"][i], ctx).float().transpose(0, 1)
        qi = q[i].float().unsqueeze(1)  # [heads, 1, dim]
        res = F.scaled_dot_product_attention(
            qi, keys, values, scale=HEAD_DIM**-0.5, enable_gqa=True
        )
        out[i] = res.squeeze(1)
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if torch.isnan(out).any():
        return float("nan")
    return float((out.float() - ref).norm() / ref.norm())


def decode_call(
    q: torch.Tensor, inp: dict[str, Any], out: torch.Tensor, knobs: dict[str, Any]
) -> Callable[[], None]:
    """One decode-attention launch over ``paged_inputs`` into ``out``, with ``knobs`` (split
    count, tiling) as ``paged_decode_attention`` takes them."""
    from engine.model.kernels.paged_attention import paged_decode_attention

    def call() -> None:
        paged_decode_attention(
            q,
            inp["k_cache"],
            inp["v_cache"],
            inp["tables"],
            inp["lens"],
            HEAD_DIM**-0.5,
            out=out,
            **knobs,
        )

    return call


def decode_variants(batch: int) -> list[dict[str, Any]]:
    base = {"block_n": 64, "num_warps": 4, "num_stages": 2, "heads_fastest": False}
    out: list[dict[str, Any]] = []
    split_options = [None, 1, 2, 4] if batch >= 128 else [None, 2, 4, 8, 16]
    for splits in split_options:
        out.append({**base, "num_splits": splits})
    if batch >= 128:
        for change in (
            {"block_n": 32},
            {"block_n": 128},
            {"num_warps": 8},
            {"num_stages": 3},
            {"num_stages": 4},
            {"heads_fastest": True},
            {"block_n": 128, "num_warps": 8},
            {"block_n": 128, "num_warps": 8, "num_stages": 3},
        ):
            out.append({**base, "num_splits": None, **change})
    return out


def run_decode(batch: int, lens: list[int], label: str) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda").manual_seed(batch)
    inp = paged_inputs(lens, gen)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE, generator=gen)
    ref = decode_reference(q, inp, lens)
    kv_bytes = sum(lens) * NUM_KV_HEADS * HEAD_DIM * 2 * q.element_size()
    rows = []
    for variant in decode_variants(batch):
        out = torch.full_like(q, float("nan"))
        call = decode_call(q, inp, out, variant)
        call()
        torch.cuda.synchronize()
        err = rel_err(out, ref)
        ms = bench_ms(call)
        rows.append(
            {
                "case": label,
                "batch": batch,
                "mean_ctx": sum(lens) / batch,
                **variant,
                "ms": ms,
                "tb_s": kv_bytes / ms / 1e9,
                "rel_err": err,
                "ok": err < BF16_TOLERANCE,
            }
        )
    # The bar to reach: SDPA on contiguous K/V of the same total size (no paging).
    if len(set(lens)) == 1:
        ctx = lens[0]
        kc = torch.randn(batch, NUM_KV_HEADS, ctx, HEAD_DIM, device="cuda", dtype=DTYPE)
        vc = torch.randn_like(kc)
        qs = q.unsqueeze(2)
        ms = bench_ms(lambda: F.scaled_dot_product_attention(qs, kc, vc, enable_gqa=True))
        rows.append(
            {
                "case": label + "/sdpa-contiguous",
                "batch": batch,
                "mean_ctx": ctx,
                "ms": ms,
                "tb_s": kv_bytes / ms / 1e9,
                "rel_err": 0.0,
                "ok": True,
            }
        )
    return rows


def run_prefill(num_seqs: int, q_len: int, cached: int) -> list[dict[str, Any]]:
    """``num_seqs`` prompts of ``q_len`` new tokens after ``cached`` tokens of prefix hit."""
    from engine.model.kernels.prefill_attention import prefill_attention

    gen = torch.Generator(device="cuda").manual_seed(q_len + cached)
    ctx = q_len + cached
    inp = paged_inputs([ctx] * num_seqs, gen)
    q = torch.randn(
        num_seqs * q_len, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE, generator=gen
    )
    # [seqs, ctx, kv_heads, dim], contiguous copies for the SDPA reference and baseline.
    keys = torch.stack([gather_seq(inp["k_cache"], inp["tables"][i], ctx) for i in range(num_seqs)])
    values = torch.stack(
        [gather_seq(inp["v_cache"], inp["tables"][i], ctx) for i in range(num_seqs)]
    )
    k_new = keys[:, cached:].reshape(-1, NUM_KV_HEADS, HEAD_DIM)
    v_new = values[:, cached:].reshape(-1, NUM_KV_HEADS, HEAD_DIM)
    cu = torch.arange(0, num_seqs + 1, device="cuda", dtype=torch.int32) * q_len
    mask = torch.ones(q_len, ctx, dtype=torch.bool, device="cuda").tril(cached)
    qb = q.view(num_seqs, q_len, NUM_HEADS, HEAD_DIM).transpose(1, 2)
    kb, vb = keys.transpose(1, 2), values.transpose(1, 2)
    ref = (
        F.scaled_dot_product_attention(
            qb.float(), kb.float(), vb.float(), attn_mask=mask, enable_gqa=True
        )
        .transpose(1, 2)
        .reshape_as(q)
    )
    flops = 4 * num_seqs * NUM_HEADS * HEAD_DIM * (q_len * cached + q_len * (q_len + 1) / 2)
    rows = []
    label = f"prefill {num_seqs}x{q_len}+{cached}"
    variants = [
        {"block_rows": r, "block_n": n, "num_warps": w, "num_stages": s}
        for (r, n, w, s) in [
            (128, 64, 8, 2),
            (128, 64, 4, 2),
            (64, 64, 4, 2),
            (128, 32, 4, 3),
            (256, 64, 8, 2),
            (128, 128, 8, 2),
            (128, 64, 8, 3),
        ]
    ]
    for paged in [False, True] if cached == 0 else [True]:
        for variant in variants:
            out = torch.full_like(q, float("nan"))
            cache_args = (
                {
                    "k_cache": inp["k_cache"],
                    "v_cache": inp["v_cache"],
                    "block_tables": inp["tables"],
                }
                if paged
                else {}
            )

            def call(
                out: torch.Tensor = out, v: dict[str, Any] = variant, c: dict[str, Any] = cache_args
            ) -> None:
                prefill_attention(
                    q, k_new, v_new, cu, inp["lens"], q_len, HEAD_DIM**-0.5, out=out, **c, **v
                )

            call()
            torch.cuda.synchronize()
            err = rel_err(out, ref)
            ms = bench_ms(call)
            rows.append(
                {
                    "case": label + (" paged" if paged else " fresh"),
                    **variant,
                    "ms": ms,
                    "tflop_s": flops / ms / 1e9,
                    "rel_err": err,
                    "ok": err < BF16_TOLERANCE,
                }
            )
    sdpa_ms = bench_ms(
        lambda: F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, enable_gqa=True)
    )
    rows.append(
        {
            "case": label + " sdpa-padded(mask)",
            "ms": sdpa_ms,
            "tflop_s": flops / sdpa_ms / 1e9,
            "rel_err": 0.0,
            "ok": True,
        }
    )
    if cached == 0:
        causal_ms = bench_ms(
            lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True)
        )
        rows.append(
            {
                "case": label + " sdpa-padded(causal)",
                "ms": causal_ms,
                "tflop_s": flops / causal_ms / 1e9,
                "rel_err": 0.0,
                "ok": True,
            }
        )
    return rows


def reference_decode_lens(batch: int, rng: random.Random) -> list[int]:
    """Contexts spread like the reference workload's mid-run decode batch (mean ~850)."""
    return [rng.randint(100, 1024) + rng.randint(0, 600) for _ in range(batch)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/kernels", help="directory for kernels.json")
    parser.add_argument("--quick", action="store_true", help="fewer cases (a smoke run)")
    parser.add_argument(
        "--only",
        choices=["all", "attention", "store", "sampler", "prefill-long"],
        default="all",
        help="one section: attention (decode + prefill), store (store_kv), sampler, "
        "prefill-long (tiling variants at 4k-32k tokens, benchmarks/prefill_long.py)",
    )
    parser.add_argument(
        "--sampler-variants",
        default="",
        help="comma-separated sampler variants (default: all of them)",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels needs a CUDA device", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    result: dict[str, Any] = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        **copy_ceiling(),
    }
    print(f"{props.name}: copy ceiling {result['copy_tb_s']:.2f} TB/s", flush=True)
    sampler_ok = True
    if args.only in ("all", "sampler"):
        from benchmarks.sampler import run_sampler_section

        names = [n for n in args.sampler_variants.split(",") if n] or None
        sampler_ok = run_sampler_section(out_dir, names, args.quick)
        if args.only == "sampler":
            return 0 if sampler_ok else 1
    rng = random.Random(0)
    rows: list[dict[str, Any]] = []
    if args.only in ("all", "attention"):
        rows += run_decode(256, [REF_MEAN_CONTEXT] * 256, "decode 256x850")
        rows += run_decode(256, reference_decode_lens(256, rng), "decode 256 mixed")
        if not args.quick:
            for batch in (1, 8, 32, 64, 128):
                rows += run_decode(
                    batch, reference_decode_lens(batch, rng), f"decode {batch} mixed"
                )
        rows += run_prefill(16, 1024, 0)
        if not args.quick:
            rows += run_prefill(8, 512, 512)
    if args.only == "prefill-long":
        from benchmarks.prefill_long import run_prefill_long

        rows += run_prefill_long([(32768, 0), (16384, 16384), (8192, 0)])
    if args.only in ("all", "store"):
        from benchmarks.store import run_store

        rows += run_store()
    result["rows"] = rows
    (out_dir / "kernels.json").write_text(json.dumps(result, indent=1))
    for row in rows:
        knobs = " ".join(
            f"{k}={row[k]}"
            for k in (
                "num_splits",
                "block_n",
                "block_rows",
                "num_warps",
                "num_stages",
                "heads_fastest",
                "heavy_first",
                "tma",
                "error",
            )
            if k in row
        )
        rate = f"{row['tb_s']:.2f}TB/s" if "tb_s" in row else f"{row.get('tflop_s', 0):.0f}TF/s"
        flag = "ok" if row["ok"] else "WRONG"
        print(
            f"{row['case']:<30} {knobs:<70} {row['ms'] * 1e3:8.1f}us {rate:>10} "
            f"err={row.get('rel_err', 0):.1e} {flag}"
        )
    return 0 if all(row["ok"] for row in rows) and sampler_ok else 1


if __name__ == "__main__":
    sys.exit(main())
