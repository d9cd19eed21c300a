"""Check and time every variant of the GPU sampler (``benchmarks.sampler_variants``) on CUDA.

``python -m benchmarks.sampler --out DIR`` (or ``python -m benchmarks.kernels --only
sampler``) probes the Gumbel noise of the largest uniforms, then for each variant checks greedy
equality with ``argmax``, determinism and its token distribution (chi-square), and times it at
1, 64 and 256 rows of 151,936 bf16 logits against PyTorch baselines. ``sampler.json`` is
rewritten after each variant, so a crash keeps what was measured before it. It also checks
that the engine's sampler (``engine.model.kernels.sampler``) draws the tokens of the variant it
is named after.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_timing import time_call

SAMPLER_DEVICE = "cuda"
SAMPLER_VOCAB = 151936
SAMPLER_ROWS = (1, 64, 256)
SAMPLER_TEMP = 0.6
# Rows of the distribution checks: 64 columns; the full vocabulary with 48 live columns.
CHECK_ROWS = 256  # greedy and determinism checks
CHECK_SMALL_ROWS, CHECK_SMALL_VOCAB = 65536, 64
CHECK_FULL_ROWS, CHECK_FULL_LIVE = 8192, 48
# Chi-square checks fail below this p-value (Wilson-Hilferty approximation).
SAMPLER_MIN_P = 1e-4


def chi2_p_value(chi2: float, dof: int) -> float:
    """Upper tail P(X > chi2) for X ~ chi-square(dof), Wilson-Hilferty approximation."""
    if dof <= 0:
        return 1.0
    z = ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _chi2(tokens: torch.Tensor, probs: torch.Tensor, support: torch.Tensor) -> dict[str, Any]:
    """Chi-square of sampled ``tokens`` against ``probs`` on the columns ``support``; bins
    expected below 5 are pooled, and any token off the support fails the check."""
    n = tokens.numel()
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    off_support = int(n - counts[support].sum())
    obs, exp = counts[support], probs[support].double() * n
    small = exp < 5
    if bool(small.any()):
        obs = torch.cat([obs[~small], obs[small].sum().view(1)])
        exp = torch.cat([exp[~small], exp[small].sum().view(1)])
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    dof = obs.numel() - 1
    p = chi2_p_value(chi2, dof)
    return {"chi2": chi2, "dof": dof, "p": p, "off_support": off_support}


def sampler_inputs(rows: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """bf16 logits ``[rows, vocab]``: ``randn`` (x3, flat) or ``peaked`` (a few hot tokens on
    a N(0, 2) background, closer to a language model's: what ``prune`` can exploit)."""
    logits = torch.randn(rows, SAMPLER_VOCAB, device=SAMPLER_DEVICE, generator=gen)
    if kind == "randn":
        return (logits * 3).bfloat16()
    logits *= 2
    hot = torch.randint(0, SAMPLER_VOCAB, (rows, 8), device=SAMPLER_DEVICE, generator=gen)
    boost = torch.rand(rows, 8, device=SAMPLER_DEVICE, generator=gen) * 10 + 10
    return logits.scatter_add_(1, hot, boost).bfloat16()


def sampler_checks(name: str, gen: torch.Generator) -> dict[str, Any]:
    """Greedy rows == argmax (bf16 ties: the first), same seed -> same tokens, and the token
    frequencies of two distributions (small vocabulary; full vocabulary, sparse support)."""
    from benchmarks.sampler_variants import SAMPLER_VARIANTS, sample_tokens

    variant = SAMPLER_VARIANTS[name]
    out: dict[str, Any] = {}
    logits = sampler_inputs(CHECK_ROWS, "randn", gen)
    zeros = torch.zeros(CHECK_ROWS, device=SAMPLER_DEVICE)
    greedy = sample_tokens(logits, zeros, 0, variant=name)
    out["greedy_ok"] = bool(torch.equal(greedy, logits.float().argmax(-1)))
    temps = torch.full((CHECK_ROWS,), 2.0, device=SAMPLER_DEVICE)  # flat: seeds must differ
    first = sample_tokens(logits, temps, 12345, variant=name)
    again = sample_tokens(logits, temps, 12345, variant=name)
    other = sample_tokens(logits, temps, 12346, variant=name)
    in_range = bool(((first >= 0) & (first < SAMPLER_VOCAB)).all())
    out["deterministic_ok"] = bool(torch.equal(first, again)) and in_range
    out["seed_changes_tokens"] = not bool(torch.equal(first, other))
    if not variant.is_sampler:
        out["ok"] = out["greedy_ok"] and out["deterministic_ok"]
        return out
    # 64 columns, many rows of the same logits.
    rows, vocab = CHECK_SMALL_ROWS, CHECK_SMALL_VOCAB
    row = torch.randn(vocab, device=SAMPLER_DEVICE, generator=gen)
    small = row.expand(rows, vocab).contiguous().bfloat16()
    tokens = sample_tokens(
        small, torch.full((rows,), SAMPLER_TEMP, device=SAMPLER_DEVICE), 7, variant=name
    )
    probs = torch.softmax(small[0].float() / SAMPLER_TEMP, -1)
    out["small_vocab"] = _chi2(tokens, probs, torch.arange(vocab, device=SAMPLER_DEVICE))
    # The full vocabulary, a few live columns spread over every part of it (all splits).
    rows, live = CHECK_FULL_ROWS, CHECK_FULL_LIVE
    support = torch.randperm(SAMPLER_VOCAB, device=SAMPLER_DEVICE, generator=gen)[:live]
    support = support.sort().values
    row = torch.full((SAMPLER_VOCAB,), -60.0, device=SAMPLER_DEVICE)
    row[support] = torch.randn(live, device=SAMPLER_DEVICE, generator=gen) * 1.5
    big = row.expand(rows, SAMPLER_VOCAB).contiguous().bfloat16()
    tokens = sample_tokens(
        big, torch.full((rows,), SAMPLER_TEMP, device=SAMPLER_DEVICE), 8, variant=name
    )
    probs = torch.softmax(big[0].float() / SAMPLER_TEMP, -1)
    out["full_vocab"] = _chi2(tokens, probs, support)
    del big
    out["ok"] = (
        out["greedy_ok"]
        and out["deterministic_ok"]
        and out["seed_changes_tokens"]
        and all(
            out[k]["p"] > SAMPLER_MIN_P and out[k]["off_support"] == 0
            for k in ("small_vocab", "full_vocab")
        )
    )
    return out


def engine_check(gen: torch.Generator) -> dict[str, Any]:
    """The engine's kernel against its variant here: the same tokens, greedy and sampled."""
    from benchmarks.sampler_variants import DEFAULT_SAMPLER_VARIANT, sample_tokens
    from engine.model.kernels.sampler import sample_tokens as engine_sample

    out: dict[str, Any] = {"variant": DEFAULT_SAMPLER_VARIANT}
    for rows in SAMPLER_ROWS:
        logits = sampler_inputs(rows, "randn", gen)
        temps = torch.full((rows,), SAMPLER_TEMP, device=SAMPLER_DEVICE)
        temps[::2] = 0.0  # greedy rows among the sampled ones
        mine = engine_sample(logits, temps, 12345)
        theirs = sample_tokens(logits, temps, 12345, variant=DEFAULT_SAMPLER_VARIANT)
        out[str(rows)] = bool(torch.equal(mine, theirs))
    out["ok"] = all(out[str(rows)] for rows in SAMPLER_ROWS)
    return out


def gumbel_tail_probe() -> dict[str, Any]:
    """Is the noise finite and accurate for the largest uniforms the kernels draw? (The hardware
    log2 is approximate: -log2(u) for u = 1 - 2**-24 is 8.6e-8, about its absolute error.)"""
    from benchmarks.sampler_variants import PROBE_MODES, gumbel_probe

    k = torch.arange(1, 1 << 14, device=SAMPLER_DEVICE, dtype=torch.float64)
    ref_u = 1 - k * 2.0**-24  # the reference kernel's top uniforms (tl.rand4x)
    tiles_u = 1 - (2 * k - 1) * 2.0**-24  # the tiles kernels' top uniforms
    out: dict[str, Any] = {}
    for mode in PROBE_MODES:
        u = ref_u if mode in ("ref", "log2") else tiles_u
        try:
            got = gumbel_probe(u.float(), mode).double()
            _sync()
        except Exception as exc:  # noqa: BLE001
            out[mode] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        exact = -torch.log2(u) if mode == "log2" else -torch.log2(-torch.log2(u))
        finite = torch.isfinite(got)
        err = (got - exact).abs()
        out[mode] = {
            "non_finite": int((~finite).sum()),
            "max_abs_err": float(err[finite].max()) if bool(finite.any()) else float("nan"),
            "max_rel_err": float((err / exact.abs())[finite].max()) if bool(finite.any()) else 0.0,
            "non_positive": int((got <= 0).sum()) if mode == "log2" else None,
            "max_value": float(got[finite].max()) if bool(finite.any()) else float("nan"),
        }
    return out


def run_sampler(out_dir: Path, names: list[str] | None, quick: bool) -> list[dict[str, Any]]:
    """Check then time each sampler variant; ``sampler.json`` is rewritten after each one."""
    from benchmarks.sampler_variants import (
        DEFAULT_SAMPLER_VARIANT,
        SAMPLER_VARIANTS,
        sample_tokens,
    )

    unknown = [n for n in names or [] if n not in SAMPLER_VARIANTS]
    if unknown:
        print(f"unknown sampler variants {unknown}; known: {list(SAMPLER_VARIANTS)}")
    names = [n for n in names or [] if n in SAMPLER_VARIANTS] or list(SAMPLER_VARIANTS)
    gen = torch.Generator(device=SAMPLER_DEVICE).manual_seed(0)
    result: dict[str, Any] = {
        "vocab": SAMPLER_VOCAB,
        "temperature": SAMPLER_TEMP,
        "engine_default": DEFAULT_SAMPLER_VARIANT,
        "gumbel_tail": gumbel_tail_probe(),
        "engine": engine_check(gen),
        "variants": {},
        "rows": [],
    }
    path = out_dir / "sampler.json"
    path.write_text(json.dumps(result, indent=1))
    inputs = {r: sampler_inputs(r, "randn", gen) for r in SAMPLER_ROWS}
    top = max(SAMPLER_ROWS)
    peaked = sampler_inputs(top, "peaked", gen)
    rows_out: list[dict[str, Any]] = result["rows"]

    def add_row(name: str, rows: int, kind: str, fn: Any) -> None:
        row: dict[str, Any] = {"variant": name, "rows": rows, "logits": kind}
        try:
            fn()
            _sync()
            row.update(time_call(fn))
            best = row.get("us_graph", row["us_eager"])
            row["gb_s"] = rows * SAMPLER_VOCAB * 2 / (best * 1e-6) / 1e9
        except Exception as exc:  # noqa: BLE001 - report, keep going
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        rows_out.append(row)
        path.write_text(json.dumps(result, indent=1))
        print_sampler_row(row)

    # Baselines: a PyTorch argmax (the read floor) and PyTorch's softmax + exponential route.
    for r, logits in inputs.items():
        add_row("torch-argmax", r, "randn", lambda x=logits: x.argmax(-1))
        temps = torch.full((r,), SAMPLER_TEMP, device=SAMPLER_DEVICE)

        def torch_sample(x: torch.Tensor = logits, t: torch.Tensor = temps) -> torch.Tensor:
            probs = torch.softmax(x.float() / t[:, None], -1)
            return probs.div_(torch.empty_like(probs).exponential_()).argmax(-1)

        if not quick:
            add_row("torch-softmax-exp", r, "randn", torch_sample)
    for name in names:
        print(f"-- {name}: {SAMPLER_VARIANTS[name]}", flush=True)
        try:
            checks = sampler_checks(name, gen)
            _sync()
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile or crashes
            checks = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800]}
        result["variants"][name] = checks
        path.write_text(json.dumps(result, indent=1))
        print(f"   checks: {json.dumps(checks)}", flush=True)
        if "error" in checks:
            continue
        for r, logits in inputs.items():
            temps = torch.full((r,), SAMPLER_TEMP, device=SAMPLER_DEVICE)
            add_row(
                name,
                r,
                "randn",
                lambda x=logits, t=temps, n=name: sample_tokens(x, t, 1, variant=n),
            )
        greedy = torch.zeros(top, device=SAMPLER_DEVICE)
        add_row(
            name + " (greedy)",
            top,
            "randn",
            lambda x=inputs[top], t=greedy, n=name: sample_tokens(x, t, 1, variant=n),
        )
        hot_t = torch.full((top,), SAMPLER_TEMP, device=SAMPLER_DEVICE)
        add_row(
            name, top, "peaked", lambda x=peaked, t=hot_t, n=name: sample_tokens(x, t, 1, variant=n)
        )
    # The fastest variant that passed its checks and samples, per batch size (CUDA-graph time).
    best: dict[str, Any] = {}
    for r in SAMPLER_ROWS:
        timed = [
            (row.get("us_graph", row.get("us_eager")), row["variant"])
            for row in rows_out
            if row["rows"] == r
            and row["logits"] == "randn"
            and row["variant"] in result["variants"]
            and result["variants"][row["variant"]].get("ok")
            and SAMPLER_VARIANTS[row["variant"]].is_sampler
            and "error" not in row
        ]
        if timed:
            us, name = min(timed)
            best[str(r)] = {"variant": name, "us": us}
    result["fastest_ok_sampler"] = best
    path.write_text(json.dumps(result, indent=1))
    failed = [n for n, c in result["variants"].items() if not c.get("ok")]
    print(f"sampler: fastest passing variant per rows {json.dumps(best)}; failed: {failed}; "
          f"engine kernel matches {DEFAULT_SAMPLER_VARIANT}: {result['engine']['ok']}")
    return rows_out


def _sync() -> None:
    if SAMPLER_DEVICE == "cuda":
        torch.cuda.synchronize()


def print_sampler_row(row: dict[str, Any]) -> None:
    if "error" in row:
        print(
            f"   {row['variant']:<28} rows={row['rows']:<4} {row['logits']:<7} ERROR {row['error']}"
        )
        return
    graph = f"{row['us_graph']:8.1f}us" if "us_graph" in row else "       -  "
    print(
        f"   {row['variant']:<28} rows={row['rows']:<4} {row['logits']:<7} graph {graph} "
        f"eager {row['us_eager']:8.1f}us {row['gb_s']:7.0f} GB/s",
        flush=True,
    )


def run_sampler_section(out_dir: Path, names: list[str] | None, quick: bool) -> bool:
    """:func:`run_sampler`, then whether every variant passed its checks and ran."""
    rows = run_sampler(out_dir, names, quick)
    result = json.loads((out_dir / "sampler.json").read_text())
    variants_ok = all(v.get("ok") for v in result["variants"].values())
    return variants_ok and result["engine"]["ok"] and not any("error" in row for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/kernels", help="directory for sampler.json")
    parser.add_argument("--quick", action="store_true", help="no PyTorch softmax baseline")
    parser.add_argument(
        "--variants", default="", help="comma-separated sampler variants (default: all of them)"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_sampler needs a CUDA device", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(torch.cuda.get_device_properties(0).name, flush=True)
    names = [n for n in args.variants.split(",") if n] or None
    return 0 if run_sampler_section(out_dir, names, args.quick) else 1


if __name__ == "__main__":
    sys.exit(main())
