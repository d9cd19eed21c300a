"""The device profile: the real model runner timed over every step shape a configuration can make.

A trace's own steps price only the shapes its run took; the start-up calibration
(engine/calibration.py) adds a short ladder. A profile times, once per device and model, a grid
designed to cover every step any configuration can produce on that model:

- decode batches of 1..512 sequences over mean contexts up to ``max_model_len``, each at uniform
  lengths and at a spread of lengths around the same mean (a batch of mixed lengths costs more
  than its mean predicts: the longest row bounds its attention);
- prefills by total tokens (to 32k) x number of prompts x cached-prefix share (the cached part
  is read through the KV cache, not computed);
- decode batches over shared prefixes, laid out as the prefix cache lays them (the same physical
  blocks at the head of each row's block table): batch size x context x shared share x number
  of prefixes (a block several rows read comes from memory once, the other reads may hit L2);
- chunked mixed batches: a prefill chunk x decode rows x decode context;
- CUDA graph and eager (``ScheduledBatch.eager``) of each shape a graph can run.

Points come in *levels*; the profiler runs level by level and, under its time budget, drops the
remaining points in this order (``LEVELS``, last dropped first): 0 the coarse corners of every
kind; 1 finer decode batch sizes and contexts, and prefill prompt counts; 2 the spread of
lengths, cached prefixes and decodes over shared prefixes; 3 eager copies of the graph shapes; 4
a denser mixed grid.
A point's cost is forecast before it runs (engine/profile_forecast.py); the points themselves
are ``ProfilePoint`` (engine/profile_point.py). Each timed row is a calibration row
(``calibration.time_batch``) plus what the point was, so the what-if reads a profile as it reads
a trace header's calibration. This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from engine.calibration import time_batch
from engine.config import Config
from engine.errors import ReplayLLMError
from engine.executor import Executor
from engine.graph_sizes import mixed_graph_key
from engine.profile_forecast import CostForecast
from engine.profile_point import ProfilePoint
from tracing.errors import TraceError
from tracing.header import executor_device
from tracing.layout import read_json_object
from tracing.validate import check_profile_rows

PROFILE_FORMAT = "replayllm-profile"
PROFILE_VERSION = 1
LEVELS = ("coarse", "fine sizes", "spread, cached and shared prefix", "eager", "dense mixed")
# Decode: batch sizes x mean context (capped at max_model_len and by the pool).
DECODE_BATCHES = {0: (1, 8, 64, 256, 512), 1: (2, 4, 16, 32, 128, 192, 384)}
DECODE_CONTEXTS = {0: (128, 1024, 8192, 32768), 1: (512, 2048, 4096, 16384)}
# A spread batch: rows at these fractions of the mean context, in turn (mean 1.0).
SPREAD_FRACTIONS = (0.125, 0.375, 1.0, 2.5)
# Prefill: total tokens x prompts (each prompt at most max_model_len) x cached-prefix share.
PREFILL_TOKENS = {0: (16, 256, 2048, 8192, 32768), 1: (64, 1024, 4096, 16384)}
PREFILL_PROMPTS = {0: (1, 16), 1: (4, 64, 256)}
CACHED_SHARES = (0.5, 0.9)
# Decode over shared prefixes (level 2): batch size x context x the share of each context its
# prefix holds (in whole blocks: the prefix cache shares full blocks only) x how many prefixes
# the rows fall into (row i shares prefix i mod groups, as traffic with a few system prompts).
SHARED_BATCHES = (8, 32, 128)
SHARED_CONTEXTS = (1024, 4096)
SHARED_SHARES = (0.25, 0.5, 0.9)
SHARED_GROUPS = (1, 4)
# Mixed: prefill chunk tokens x decode rows x decode context.
MIXED_CHUNKS = {0: (256, 2048), 4: (64, 512, 1024, 8192)}
MIXED_ROWS = {0: (16, 128), 4: (1, 64, 256)}
MIXED_CONTEXTS = {0: (1024,), 4: (256, 4096)}
# A profile's ``decode_tables``: each decode ran over its own block tables (synthetic ids are
# unique, engine/calibration.py). A profile without it ran most decodes over tables the runner
# kept from earlier points (docs/BENCHMARKS.md §7h): its shared prefixes never shared.
DECODE_TABLES_OWN = "own"
DEFAULT_BUDGET_S = 170.0
DEFAULT_REPEATS = 3
# The most timed runs a point may ask for: the start-up calibration's bound (Config's
# calibration_repeats). Either way a point stops repeating at the budget (``run_profile``).
MAX_REPEATS = 1000
# The model's shape in a profile's key (``profile_key``): the architecture alone names a family
# (the tiny model and Qwen3-0.6B are both Qwen3ForCausalLM), whose sizes time differently.
MODEL_SHAPE = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
               "intermediate_size", "vocab_size")


class ProfileError(ReplayLLMError):
    """A profile cannot be written or read."""


def check_profile_settings(budget_s: float, repeats: int, finite: bool = True) -> None:
    """A budget > 0 seconds (finite unless not ``finite``: no budget) and 1 to ``MAX_REPEATS``
    repeats, else ``ProfileError``."""
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or \
            not (budget_s > 0 and (math.isfinite(budget_s) or not finite)):
        raise ProfileError(f"--budget-s must be a finite number of seconds > 0, got {budget_s!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or \
            not 1 <= repeats <= MAX_REPEATS:
        raise ProfileError(f"--repeats must be an integer in [1, {MAX_REPEATS}], got {repeats!r}")


def _spread(mean: int, count: int, longest: int) -> tuple[int, ...]:
    """``count`` contexts averaging about ``mean`` (cycling through ``SPREAD_FRACTIONS``), none
    beyond ``longest``: the mean is scaled down to fit (the spread kept)."""
    mean = min(mean, int(longest / max(SPREAD_FRACTIONS)))
    return tuple(max(2, int(mean * SPREAD_FRACTIONS[i % len(SPREAD_FRACTIONS)]))
                 for i in range(count))


def _prompts(tokens: int, count: int, share: float, max_len: int) -> tuple[tuple[int, int], ...]:
    """``count`` prompts computing ``tokens`` in all, each with a cached prefix of ``share`` of
    its length (None-like empty: a prompt would exceed ``max_len``)."""
    each, rest = divmod(tokens, count)
    out = []
    for i in range(count):
        new = each + (1 if i < rest else 0)
        cached = int(new * share / (1 - share)) if share else 0
        if new < 1 or new + cached > max_len:
            return ()
        out.append((new, cached))
    return tuple(out)


def _crossed(first: dict[int, tuple[int, ...]], second: dict[int, tuple[int, ...]]
             ) -> Iterator[tuple[int, int, int]]:
    """(level, a, b) over both tables: a pair's level is the later of its two values'."""
    for level_a, values_a in first.items():
        for level_b, values_b in second.items():
            for a in values_a:
                for b in values_b:
                    yield max(level_a, level_b), a, b


def _decode_points(config: Config) -> Iterator[ProfilePoint]:
    longest = config.max_model_len - 1
    for level, batch, ctx in _crossed(DECODE_BATCHES, DECODE_CONTEXTS):
        ctx = min(ctx, longest)
        yield ProfilePoint("decode", level, (ctx,) * batch, label=f"decode {batch}x{ctx}")
    for batch in (8, 64, 256, 512) if longest >= 2 else ():  # a spread needs two lengths
        for ctx in (1024, 8192):
            contexts = _spread(ctx, batch, longest)
            mean = sum(contexts) // len(contexts)
            yield ProfilePoint("decode", 2, contexts, label=f"decode {batch}x~{mean} spread")
    yield from _shared_prefix_points(config)


def _shared_prefix_points(config: Config) -> Iterator[ProfilePoint]:
    """Decodes whose rows share a prefix: whole blocks, each row's last block its own (the one
    its new token is written to, as a decode's always is)."""
    block_size = config.kvcache_block_size
    for batch in SHARED_BATCHES:
        for ctx in SHARED_CONTEXTS:
            ctx = min(ctx, config.max_model_len - 1)
            for share in SHARED_SHARES:
                blocks = min(int(ctx * share) // block_size, (ctx - 1) // block_size)
                for groups in SHARED_GROUPS:
                    if blocks and groups < batch:
                        shared = blocks * block_size
                        yield ProfilePoint("decode", 2, (ctx,) * batch, prefix_groups=groups,
                                           prefix_tokens=shared,
                                           label=f"decode {batch}x{ctx}, {shared} shared in "
                                           f"{groups}")


def _prefill_points(config: Config) -> Iterator[ProfilePoint]:
    for level, tokens, count in _crossed(PREFILL_TOKENS, PREFILL_PROMPTS):
        prompts = _prompts(tokens, count, 0.0, config.max_model_len)
        if prompts:
            yield ProfilePoint("prefill", level, prompts=prompts,
                               label=f"prefill {tokens} in {count}")
    for tokens in (256, 2048, 8192):
        for count in (1, 16):
            for share in CACHED_SHARES:
                prompts = _prompts(tokens, count, share, config.max_model_len)
                if prompts:
                    yield ProfilePoint("prefill", 2, prompts=prompts,
                                       label=f"prefill {tokens} in {count}, {share:.0%} cached")


def _mixed_points(config: Config) -> Iterator[ProfilePoint]:
    for level, chunk, rows in _crossed(MIXED_CHUNKS, MIXED_ROWS):
        for at, contexts in MIXED_CONTEXTS.items():
            for ctx in contexts:
                ctx = min(ctx, config.max_model_len - 1)
                prompt = min(chunk, config.max_model_len)
                yield ProfilePoint("mixed", max(level, at), (ctx,) * rows, ((prompt, 0),),
                                   label=f"mixed {prompt} + {rows}x{ctx}")


def profile_grid(config: Config, graph_shapes: Callable[[ProfilePoint], bool] | None = None
                 ) -> list[ProfilePoint]:
    """Every point ``config`` can run (pool, token budget, max_num_seqs, max_model_len), in
    budget order: by level, then kind. ``graph_shapes``: whether a CUDA graph runs a point
    (level 3 repeats those eagerly; None: no graphs, no eager copies)."""
    def fits(point: ProfilePoint) -> bool:
        tokens = sum(n for n, _ in point.prompts) + len(point.decode_contexts)
        return (point.num_seqs <= config.max_num_seqs and min(point.decode_contexts, default=1) >= 1
                and tokens <= config.max_num_batched_tokens
                and point.blocks(config.kvcache_block_size) <= config.num_kvcache_blocks)

    unique: dict[tuple[Any, ...], ProfilePoint] = {}
    for gen in (_decode_points, _prefill_points, _mixed_points):
        for point in gen(config):
            shape = (point.kind, point.decode_contexts, point.prompts, point.prefix_groups,
                     point.prefix_tokens)
            if fits(point) and (shape not in unique or unique[shape].level > point.level):
                unique[shape] = point
    points = list(unique.values())
    if graph_shapes is not None:
        points += [dataclasses.replace(p, eager=True, level=3, label=p.label + ", eager")
                   for p in points if p.level <= 1 and graph_shapes(p)]
    return sorted(points, key=lambda p: p.level)


def profile_key(description: dict[str, Any], engine_version: str) -> dict[str, Any]:
    """What a profile is valid for, from the executor's ``describe()``."""
    model = description.get("model") or {}
    key = {
        "device": executor_device(description) or "unknown",
        "architecture": model.get("architecture"),
        "dtype": description.get("dtype"),
        "tensor_parallel_size": int(description.get("tensor_parallel_size", 1)),
        "attention_backend": description.get("attention_backend"),
        "engine_version": engine_version,
    }
    if all(model.get(k) is not None for k in MODEL_SHAPE):  # which model, not just its family
        key["model"] = ("{num_layers} layers, hidden {hidden_size}, heads {num_heads}/"
                        "{num_kv_heads} x {head_dim}, ffn {intermediate_size}, vocab "
                        "{vocab_size}").format(**model)
    if "fused_kernels" in description:  # a CUDA runner: the kernels its steps ran
        key["kernels"] = {
            "fused_kernels": description["fused_kernels"],
            "blas_library": description.get("blas_library"),
            # Absent from descriptions recorded before the split-K GEMMs existed: cuBLAS.
            "split_k_gemm": bool(description.get("split_k_gemm", False)),
            "programmatic_launch": bool(description.get("programmatic_launch", False)),
        }
        # Named only when on, so the keys of profiles and traces from before it stay equal.
        if description.get("decode_longest_first"):
            key["kernels"]["decode_longest_first"] = True
        if description.get("decode_gemm_prefetch"):
            key["kernels"]["decode_gemm_prefetch"] = True
        if description.get("decode_qk_prologue"):
            key["kernels"]["decode_qk_prologue"] = True
        # Likewise: absent, eager long prompts ran the Triton kernel.
        if description.get("long_prefill_kernel", "triton") != "triton":
            key["kernels"]["long_prefill_kernel"] = description["long_prefill_kernel"]
    return key


def run_profile(executor: Executor, config: Config, budget_s: float = DEFAULT_BUDGET_S,
                repeats: int = DEFAULT_REPEATS, clock: Callable[[], float] = time.perf_counter,
                engine_version: str = "", progress: Callable[[str], None] | None = None,
                stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Time ``profile_grid`` through ``executor`` within ``budget_s`` seconds: a point is skipped
    (counted in ``skipped``; ``progress`` says so) where the time spent plus its forecast
    (``CostForecast``: its warm-up and repeats, bounded from the points of its class timed so
    far) would pass the budget, so lower levels are timed first; only the first point of a
    class (no forecast) may end past it, and a point's repeats stop at the budget once one is
    timed. Returns the profile (``save_profile`` writes it). A budget or a repeat count out of
    bounds (``check_profile_settings``; an infinite budget is none) raises ``ProfileError``.
    ``stop`` (Ctrl-C, asked between points): once true, the points left are skipped and the
    profile is marked ``interrupted``."""
    check_profile_settings(budget_s, repeats, finite=False)
    description = executor.describe()
    graph_sizes = description.get("graph_batch_sizes") or []
    graph_tokens = description.get("prefill_graph_tokens") or []
    mixed_rows = description.get("mixed_graph_decode_rows") or []

    def graph_shape(point: ProfilePoint) -> bool:
        prompt_tokens = sum(n for n, _ in point.prompts)
        if point.kind == "decode":
            return bool(graph_sizes) and point.num_seqs <= max(graph_sizes)
        if point.kind == "mixed":
            return mixed_graph_key(graph_tokens, mixed_rows, prompt_tokens, len(point.prompts),
                                   len(point.decode_contexts)) is not None
        return point.kind == "prefill" and prompt_tokens <= max(graph_tokens, default=0)

    grid = profile_grid(config, graph_shape if (graph_sizes or graph_tokens) else None)
    began = clock()
    rows, skipped, interrupted, forecast = [], 0, False, CostForecast()
    for index, point in enumerate(grid):
        if stop is not None and stop():
            interrupted, skipped = True, skipped + len(grid) - index
            break
        per_run, spent = forecast.seconds_per_run(point), clock() - began
        if spent >= budget_s:  # one note for the rest, not a line each
            skipped += len(grid) - index
            if progress is not None:
                progress(f"budget spent: the {len(grid) - index} points left are skipped")
            break
        estimate = (repeats + 1) * (per_run or 0.0)  # the warm-up and every repeat
        if spent + estimate > budget_s:
            skipped += 1
            if progress is not None:
                progress(f"{point.label}: skipped, forecast {estimate:.3g} s with "
                         f"{budget_s - spent:.3g} s of the budget left")
            continue
        started = clock()
        row = time_batch(executor, point.batch(config.kvcache_block_size), repeats, clock,
                         deadline=began + budget_s)
        forecast.record(point, (clock() - started) / (row["repeats"] + 1))
        row.update(level=point.level, label=point.label, eager=point.eager,
                   decode_context_max=max(point.decode_contexts, default=0),
                   cached_tokens=sum(c for _, c in point.prompts))
        if point.prefix_groups:  # what the what-if counts as KV read once (docs/profile.md)
            row.update(prefix_groups=point.prefix_groups, prefix_tokens=point.prefix_tokens)
        rows.append(row)
        if progress is not None:
            progress(f"{point.label}: {1e3 * row['interval_s']:.2f} ms")
    profile = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "key": profile_key(description, engine_version),
        "config": {k: getattr(config, k) for k in (
            "max_model_len", "max_num_seqs", "max_num_batched_tokens", "num_kvcache_blocks",
            "kvcache_block_size", "prefill_graph_tokens", "enforce_eager")},
        "budget_s": budget_s,
        "elapsed_s": clock() - began,
        "repeats": repeats,
        "levels": list(LEVELS),
        "points": len(grid),
        "skipped": skipped,
        "decode_tables": DECODE_TABLES_OWN,
        "rows": rows,
    }
    if interrupted:  # a prefix of the grid: its levels' last points may be missing
        profile["interrupted"] = True
    return profile


def save_profile(profile: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile, indent=1), encoding="utf-8")


def load_profile(path: str | Path) -> dict[str, Any]:
    """A profile written by ``save_profile``; a ``ProfileError`` for anything else, a key or
    row of the wrong type or out of bounds included (``tracing.validate.check_profile_rows``)."""
    data = read_json_object(path, ProfileError, "profile")
    if data.get("format") != PROFILE_FORMAT:
        raise ProfileError(f"{path}: not a {PROFILE_FORMAT} file")
    if data.get("version") != PROFILE_VERSION:
        raise ProfileError(f"{path}: profile version {data.get('version')!r}, expected "
                           f"{PROFILE_VERSION}")
    try:  # every field a reader takes, of its type and bounds (one rule: tracing.validate)
        check_profile_rows(Path(path), data)
    except TraceError as exc:
        raise ProfileError(str(exc)) from None
    if not data.get("rows"):
        raise ProfileError(f"{path}: the profile has no timed steps")
    return data
