"""``replayllm bench``: the reference workload on one GPU, this engine against transformers.

One run measures, on the ``qwen3-0.6b`` preset (random bf16 weights, Qwen3-0.6B's architecture):
this engine with tracing off (``record_events=False``), this engine writing a Parquet trace, and
transformers' continuous-batching ``generate_batch`` machinery (paged SDPA, CUDA graphs), each on
all 256 requests of DESIGN.md's reference workload. Each engine run starts from a fresh engine
(an empty prefix cache), whose construction already warmed up and compiled everything; a first
warm-up run is not counted; runs of the two modes alternate and the median of ``repeat`` is
kept. Throughput is output tokens over
the wall seconds of one ``generate``.

From the traced run it also reports the HBM bandwidth achieved by decode steps at batch 256
(KV bytes read plus weight bytes, over the step's GPU time) and peak GPU memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PRESET = "qwen3-0.6b"
REFERENCE_BATCH = 256
# Bytes a decode step must read besides KV: every weight once (tied embedding read by the head).
QWEN3_06B_WEIGHT_BYTES = 596_049_920 * 2
HBM_CEILING_TB_S = 4.3  # measured device-to-device copy rate on the H200 (GPU-NOTES.md)


def ensure_model(model_dir: Path) -> Path:
    from engine.model.checkpoint import make_model

    if not (model_dir / "config.json").is_file():
        print(f"making the {PRESET} checkpoint in {model_dir} ...", flush=True)
        make_model(PRESET, model_dir)
    return model_dir


def _requests(num_seqs: int | None) -> list[Any]:
    from replay.workloads.builtin import reference_workload

    requests = reference_workload()
    return requests[:num_seqs] if num_seqs else requests


def run_engine(
    model_dir: Path, requests: list[Any], trace_dir: Path | None, overrides: dict[str, Any]
) -> dict[str, Any]:
    """One fresh engine, one timed ``generate`` of every request."""
    import torch

    from engine import LLM

    prompts = [list(r.prompt) for r in requests]
    params = [r.sampling_params() for r in requests]
    began = time.perf_counter()
    llm = LLM(
        str(model_dir),
        trace_dir=str(trace_dir) if trace_dir else None,
        record_events=trace_dir is not None,
        **overrides,
    )
    init_s = time.perf_counter() - began
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - began
    free, total = torch.cuda.mem_get_info()
    tokens = sum(len(o["token_ids"]) for o in outputs)
    result = {
        "tracing": trace_dir is not None,
        "output_tokens": tokens,
        "seconds": elapsed,
        "tok_s": tokens / elapsed,
        "init_s": init_s,
        "steps": llm.core.step_index,
        "preemptions": llm.core.scheduler.num_preemptions,
        "num_kvcache_blocks": llm.config.num_kvcache_blocks,
        "attention_backend": llm.runner.attention_backend.name,
        "gpu_used_bytes": total - free,
        "gpu_total_bytes": total,
        "torch_peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "gpu_memory_utilization": llm.config.gpu_memory_utilization,
    }
    llm.close()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return result


def decode_bandwidth(trace_dir: Path, batch: int = REFERENCE_BATCH) -> dict[str, float]:
    """Achieved bytes/s of decode steps with ``batch`` sequences, from the trace's GPU times."""
    import pandas as pd

    steps = pd.read_parquet(trace_dir / "model_step")
    at = steps[(steps["decode_seqs"] == batch) & (steps["prefill_tokens"] == 0)]
    if at.empty:
        return {}
    kv_token_bytes = 28 * 8 * 128 * 2 * 2
    moved = at["decode_context_tokens"] * kv_token_bytes + QWEN3_06B_WEIGHT_BYTES
    rate = moved / at["duration_s"]
    return {
        "decode_steps_at_batch": int(len(at)),
        "median_step_ms": float(at["duration_s"].median() * 1e3),
        "median_context": float((at["decode_context_tokens"] / batch).median()),
        "median_tb_s": float(rate.median() / 1e12),
        "fraction_of_ceiling": float(rate.median() / 1e12 / HBM_CEILING_TB_S),
        "gpu_busy_s": float(steps["duration_s"].sum()),
    }


def long_prefill(model_dir: Path, tokens: int) -> dict[str, Any]:
    """One prefill step of a fresh ``tokens``-token prompt through each kernel route for long
    prompts (``long_prefill.ROUTES``, the default first and once more last), each after an
    untimed warm-up prompt of the same length through the same route (so the same eager kernels
    are compiled and the allocator has grown before the timed step) and each on prompts of its
    own (no cache hit): its GPU time and TFLOP/s (2 x params x tokens for the GEMMs, plus causal
    attention counted once). An A/B in one process (its trace's header names the default kernel
    for every step: not a recording to time from)."""
    import random

    from engine import LLM, SamplingParams
    from engine.model.kernels import launch, long_prefill

    rng = random.Random(0)
    llm = LLM(str(model_dir), record_events=True, max_model_len=tokens + 8,
              max_num_batched_tokens=tokens + 8, max_num_seqs=1, calibration_repeats=0)
    default = launch.long_prefill_kernel()  # Config.long_prefill_kernel, set at start-up
    routes = [default] + [r for r in long_prefill.ROUTES if r != default] + [default]
    seconds: dict[str, float] = {}
    try:
        for n, route in enumerate(routes):
            launch.set_long_prefill_kernel(route)
            ids = range(10000 * n, 10000 * (n + 1))  # no prefix shared between prompts
            for _ in range(2):  # warm-up, then the timed step
                prompt = [rng.choice(ids) for _ in range(tokens)]
                llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)
            steps = llm.core.events.tables["model_step"]
            name = route if route not in seconds else f"{route}_again"
            seconds[name] = float(steps["duration_s"][-1])
            computed = steps["prefill_tokens"][-1]
    finally:
        launch.set_long_prefill_kernel(default)
        llm.close()
    layers, heads, head_dim = 28, 16, 128
    attention = 2 * 2 * layers * heads * head_dim * computed * (tokens - computed / 2)
    flops = 2 * QWEN3_06B_WEIGHT_BYTES / 2 * computed + attention
    return {"prompt_tokens": tokens, "computed_tokens": int(computed),
            "seconds": seconds[default], "tflop_s": flops / seconds[default] / 1e12,
            "kernel": default,
            **{f"{name}_seconds": value for name, value in seconds.items() if name != default}}


def main(
    json_path: str | None = None,
    repeat: int = 3,
    *,
    model_dir: str | None = None,
    trace_out: str | None = None,
    with_transformers: bool = True,
    num_seqs: int | None = None,
    overrides: dict[str, Any] | None = None,
    compare_sequential: bool = False,
    warmup: int = 1,
    variants: list[str] | None = None,
    long_prefill_tokens: int = 0,
    skip_off: bool = False,
) -> int:
    """Run the benchmark; print a table; write JSON to ``json_path``. Returns an exit code."""
    import torch

    if not torch.cuda.is_available():
        print(
            "replayllm bench: error: the engine benchmark needs a CUDA GPU; "
            "try `replayllm bench scheduler`",
            file=sys.stderr,
        )
        return 2
    from engine.model.checkpoint import cache_root

    model_path = ensure_model(Path(model_dir) if model_dir else cache_root() / "models" / PRESET)
    requests = _requests(num_seqs)
    overrides = overrides or {}
    peer: dict[str, Any] = {}
    if with_transformers:
        try:
            from benchmarks.transformers_peer import run_transformers_apart

            peer = {"transformers": run_transformers_apart(model_path, num_seqs)}
        except Exception as exc:  # the peer is someone else's code: report, don't lose the run
            peer = {"transformers_error": f"{type(exc).__name__}: {exc}"}
    work = Path(tempfile.mkdtemp(prefix="replayllm-bench-"))
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": [], "warmup": []}
    # The process's first engine runs 1-5% slower than later ones (measured on the H200:
    # 23,528 then 24,700 tok/s); its runs are reported apart, not in the medians.
    for _ in range(warmup):
        runs["warmup"].append(run_engine(model_path, requests, None, overrides))
        print(f"warm-up run: {runs['warmup'][-1]['tok_s']:,.0f} tok/s (not counted)", flush=True)
    if compare_sequential:
        runs["sequential"] = []
    for i in range(max(1, repeat)):
        if not skip_off:
            runs["off"].append(run_engine(model_path, requests, None, overrides))
        trace_dir = Path(trace_out) if trace_out and i == 0 else work / f"trace-{i}"
        runs["on"].append(run_engine(model_path, requests, trace_dir, overrides))
        if i == 0:
            runs["on"][0]["trace_dir"] = str(trace_dir)
            runs["on"][0]["decode_bandwidth"] = decode_bandwidth(trace_dir)
        line = (
            f"repeat {i}: tracing off "
            f"{runs['off'][-1]['tok_s'] if runs['off'] else float('nan'):,.0f} tok/s, "
            f"on {runs['on'][-1]['tok_s']:,.0f} tok/s"
        )
        if compare_sequential:
            sequential = {**overrides, "async_scheduling": False}
            runs["sequential"].append(
                run_engine(model_path, requests, work / f"seq-{i}", sequential)
            )
            line += f", on without overlap {runs['sequential'][-1]['tok_s']:,.0f} tok/s"
        print(line, flush=True)
    off = statistics.median(r["tok_s"] for r in runs["off"]) if runs["off"] else float("nan")
    on = statistics.median(r["tok_s"] for r in runs["on"])
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "workload": f"reference ({len(requests)} requests)",
        "overrides": overrides,
        "engine_off_tok_s": off,
        "engine_on_tok_s": on,
        "tracing_cost": 1 - on / off,
        "runs": runs,
    }
    if compare_sequential:
        sequential_tok_s = statistics.median(r["tok_s"] for r in runs["sequential"])
        result["engine_on_sequential_tok_s"] = sequential_tok_s
        result["overlap_gain"] = on / sequential_tok_s - 1
    result.update(peer)
    if "transformers" in result:
        result["speedup_vs_transformers"] = on / result["transformers"]["tok_s"]
    _write(json_path, result)
    result["variants"] = {}
    for spec in variants or []:
        variant = {**overrides, **_variant_overrides(spec)}
        # The first run's trace is kept beside the reference's (``TRACE_OUT-chunked-2048``).
        spec_runs = [
            run_engine(model_path, requests,
                       Path(f"{trace_out}-{spec}") if trace_out and i == 0
                       else work / f"{spec}-{i}", variant)
            for i in range(max(1, repeat))
        ]
        tok_s = [r["tok_s"] for r in spec_runs]
        result["variants"][spec] = {"overrides": variant, "tok_s": statistics.median(tok_s),
                                    "vs_default": statistics.median(tok_s) / on - 1,
                                    "init_s": [r["init_s"] for r in spec_runs]}
        if trace_out:  # its decode steps at the reference batch, as the default run's
            result["variants"][spec]["decode_bandwidth"] = decode_bandwidth(
                Path(f"{trace_out}-{spec}"))
        vbw = result["variants"][spec].get("decode_bandwidth") or {}
        at_batch = (f", decode at batch {REFERENCE_BATCH}: {vbw['median_step_ms']:.2f} ms, "
                    f"{vbw['median_tb_s']:.2f} TB/s" if vbw else "")
        print(f"variant {spec}: {statistics.median(tok_s):,.0f} tok/s "
              f"(init {spec_runs[0]['init_s']:.1f} s){at_batch}", flush=True)
        _write(json_path, result)
    if long_prefill_tokens:
        result["long_prefill"] = long_prefill(model_path, long_prefill_tokens)
    print_table(result)
    _write(json_path, result)
    return 0


def _variant_overrides(spec: str) -> dict[str, Any]:
    """``chunked`` or ``chunked-2048`` (the token budget) as Config overrides, each optionally
    followed by ``@KEY=VALUE`` settings (``chunked-2048@overlap_mixed_steps=false``)."""
    from engine.config import parse_overrides

    policy, *settings = spec.split("@")
    name, _, budget = policy.partition("-")
    out: dict[str, Any] = {"policy": name}
    if budget:
        out["max_num_batched_tokens"] = int(budget)
    return {**out, **parse_overrides(settings)}


def _write(json_path: str | None, result: dict[str, Any]) -> None:
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=1))


def print_table(result: dict[str, Any]) -> None:
    first_on = result["runs"]["on"][0]
    print(f"\n{result['device']}, {result['workload']}, {result['date']}")
    print(f"{'run':<34} {'tok/s':>10}  notes")
    print(f"{'replayllm, tracing off':<34} {result['engine_off_tok_s']:>10,.0f}")
    print(
        f"{'replayllm, tracing on':<34} {result['engine_on_tok_s']:>10,.0f}  "
        f"cost {result['tracing_cost']:+.1%}"
    )
    if "engine_on_sequential_tok_s" in result:
        print(
            f"{'replayllm, tracing on, no overlap':<34} "
            f"{result['engine_on_sequential_tok_s']:>10,.0f}  "
            f"overlap gains {result['overlap_gain']:+.1%}"
        )
    if "transformers_error" in result:
        print(f"{'transformers generate_batch':<34} {'failed':>10}  {result['transformers_error']}")
    if "transformers" in result:
        hf = result["transformers"]
        print(
            f"{'transformers generate_batch':<34} {hf['tok_s']:>10,.0f}  "
            f"replayllm is {result['speedup_vs_transformers']:.1f}x"
        )
    bw = first_on.get("decode_bandwidth") or {}
    if bw:
        print(
            f"decode at batch {REFERENCE_BATCH}: {bw['median_step_ms']:.2f} ms/step, "
            f"{bw['median_tb_s']:.2f} TB/s ({bw['fraction_of_ceiling']:.0%} of "
            f"{HBM_CEILING_TB_S} TB/s)"
        )
    for spec, variant in result.get("variants", {}).items():
        print(f"{'replayllm, tracing on, ' + spec:<34} {variant['tok_s']:>10,.0f}  "
              f"{variant['vs_default']:+.1%} vs the default run (tracing on)")
    if "long_prefill" in result:
        lp = result["long_prefill"]
        print(f"prefill of {lp['computed_tokens']:,} tokens ({lp['prompt_tokens']:,}-token prompt, "
              f"the rest cached): {lp['seconds'] * 1e3:.1f} ms, {lp['tflop_s']:.0f} TFLOP/s "
              f"({lp.get('kernel', 'triton')}; "
              + ", ".join(f"{k.removesuffix('_seconds')} {v * 1e3:.1f} ms" for k, v in lp.items()
                          if k.endswith("_seconds")) + ")")
    used, total = first_on["gpu_used_bytes"], first_on["gpu_total_bytes"]
    print(
        f"GPU memory: {used / 2**30:.1f} GiB used of {total / 2**30:.1f} GiB "
        f"({used / total:.1%}; gpu_memory_utilization {first_on['gpu_memory_utilization']})"
    )


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="engine benchmark (see module docstring)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model-dir", default=None, help="checkpoint (made if missing)")
    parser.add_argument("--trace-out", default=None, help="keep the first traced run's trace")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--num-seqs", type=int, default=None)
    parser.add_argument("--set", action="append", default=[], help="config override k=v")
    parser.add_argument("--warmup", type=int, default=1, help="untimed engine runs first")
    parser.add_argument("--variants", default="",
                        help="comma-separated policies to time too, e.g. chunked,chunked-2048")
    parser.add_argument("--long-prefill", type=int, default=0, metavar="TOKENS",
                        help="also time one prefill step of a TOKENS-token prompt")
    parser.add_argument("--skip-off", action="store_true",
                        help="no tracing-off runs (a shorter call; tracing cost not measured)")
    parser.add_argument(
        "--compare-sequential",
        action="store_true",
        help="also time tracing-on runs with async_scheduling=false (what overlap buys)",
    )
    args = parser.parse_args(argv)
    from engine.config import parse_override

    overrides = {}
    for item in args.set:
        key, _, text = item.partition("=")
        overrides[key] = parse_override(key, text)
    return main(
        args.json,
        args.repeat,
        model_dir=args.model_dir,
        trace_out=args.trace_out,
        with_transformers=not args.no_transformers,
        num_seqs=args.num_seqs,
        overrides=overrides,
        compare_sequential=args.compare_sequential,
        warmup=args.warmup,
        variants=[v for v in args.variants.split(",") if v],
        long_prefill_tokens=args.long_prefill,
        skip_off=args.skip_off,
    )


if __name__ == "__main__":
    sys.exit(_cli())
