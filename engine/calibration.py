"""Start-up calibration: time a few synthetic steps of sizes the run itself may never take.

A step-time model fitted on a run's own steps cannot see costs that only show in steps of another
shape: a run whose prefills are all large never reveals the launch-bound floor of a small eager
prefill, which a run under a tighter configuration (recomputing after preemptions) pays on every
one, and a run whose prefills are all small never shows a full token budget's. Timing a ladder
of prefill sizes (1 token to 16k, the larger ones as many prompts) and a few decode batches
once, before the first request, and recording them in the trace header makes those costs
identifiable. Where the runner captured CUDA graphs, the steps a graph runs are timed once more
with graphs off (``ScheduledBatch.eager``), so a what-if without graphs (``enforce_eager``,
``prefill_graph_tokens=0``) is priced from eager steps of the same sizes.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable, Collection
from typing import Any

from engine.batch import ScheduledBatch
from engine.config import Config
from engine.engine_core import batch_features
from engine.executor import Executor
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

PREFILL_TOKENS = (1, 16, 128, 512, 2048, 8192, 16384)
# A calibration prefill of up to SINGLE_PROMPT_TOKENS is one prompt; a larger one (a full token
# budget, as a run's first steps take) is prompts of PREFILL_PROMPT_TOKENS.
SINGLE_PROMPT_TOKENS = 2048
PREFILL_PROMPT_TOKENS = 1024
DECODE_BATCHES = (1, 16, 64)
DECODE_CONTEXT = 256
# Calibration sequences get ids no request can have (requests count up from 0).
FIRST_CALIBRATION_SEQ_ID = -1000
# Every synthetic sequence gets an id of its own, never reused: the runner keeps each decode
# row's block table by sequence id and writes only the blocks added since (``DecodeBuffers._fill``:
# a request's table only grows), so a step reusing an earlier step's ids would run over that
# step's tables, not its own (docs/BENCHMARKS.md §7h).
_synthetic_ids = itertools.count()
# Token id fed to the synthetic prompts: an ordinary token of any Qwen vocabulary.
FILLER_TOKEN = 13
LOW_QUANTILE, HIGH_QUANTILE = 0.1, 0.9


def synthetic_sequences(lengths: list[int], first_block: int, block_size: int) -> list[Sequence]:
    """Sequences of filler prompts of ``lengths`` over consecutive free blocks from
    ``first_block``, with ids no request, and no other synthetic sequence, has."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    seqs = []
    start = first_block
    for length in lengths:
        seq = Sequence(FIRST_CALIBRATION_SEQ_ID - next(_synthetic_ids), [FILLER_TOKEN] * length,
                       params)
        blocks = (length + block_size - 1) // block_size
        seq.block_table = list(range(start, start + blocks))
        start += blocks
        seqs.append(seq)
    return seqs


def _prefill_lengths(tokens: int, config: Config) -> list[int]:
    """Prompt lengths of a calibration prefill of ``tokens`` tokens: one prompt up to
    ``SINGLE_PROMPT_TOKENS``, else prompts of ``PREFILL_PROMPT_TOKENS`` (within max_model_len)."""
    if tokens <= min(SINGLE_PROMPT_TOKENS, config.max_model_len):
        return [tokens]
    per_prompt = min(PREFILL_PROMPT_TOKENS, config.max_model_len)
    full, rest = divmod(tokens, per_prompt)
    return [per_prompt] * full + ([rest] if rest else [])


def calibration_batches(config: Config, graph_prefill_tokens: Collection[int] = (),
                        decode_graphs: bool = False) -> list[ScheduledBatch]:
    """The synthetic steps that fit this configuration's pool, budget and model length.

    ``graph_prefill_tokens``: the token counts the executor captured prefill CUDA graphs for;
    a prompt of each is timed too, so a run whose own prefills never used one (all of them
    larger) still shows what a graph prefill costs at every padded size. The ladder's prefills
    up to the largest of them, and with ``decode_graphs`` (the executor captured decode graphs)
    the decodes, follow once more as eager steps."""
    batches = _graph_or_eager_batches(config, graph_prefill_tokens)
    largest_graph_prefill = max(graph_prefill_tokens, default=0)
    eager = [
        batch for batch in batches
        if (batch.kind == "prefill" and batch.num_batched_tokens in PREFILL_TOKENS
            and batch.num_batched_tokens <= largest_graph_prefill)
        or (batch.kind == "decode" and decode_graphs)
    ]
    return batches + [dataclasses.replace(batch, eager=True) for batch in eager]


def _graph_or_eager_batches(config: Config, graph_prefill_tokens: Collection[int]
                            ) -> list[ScheduledBatch]:
    """The ladder and the captured prefill sizes, each run as the executor would run it."""
    block_size, num_blocks = config.kvcache_block_size, config.num_kvcache_blocks
    batches = []
    for tokens in sorted(set(PREFILL_TOKENS) | set(graph_prefill_tokens)):
        lengths = _prefill_lengths(tokens, config)
        blocks = sum((n + block_size - 1) // block_size for n in lengths)
        if (
            tokens > config.max_num_batched_tokens
            or blocks > num_blocks
            or len(lengths) > config.max_num_seqs
        ):
            continue
        seqs = synthetic_sequences(lengths, 0, block_size)
        batches.append(ScheduledBatch(-1, "prefill", seqs, lengths, list(lengths), len(seqs),
                                      num_batched_tokens=tokens, sampled_seqs=seqs))
    context = min(DECODE_CONTEXT, config.max_model_len - 1)
    blocks_each = (context + block_size - 1) // block_size
    for count in DECODE_BATCHES:
        if count > config.max_num_seqs or count * blocks_each > num_blocks:
            continue
        seqs = synthetic_sequences([context] * count, 0, block_size)
        for seq in seqs:
            seq.num_computed_tokens = context - 1
        batches.append(ScheduledBatch(-1, "decode", seqs, [1] * count, [context] * count, 0,
                                      num_batched_tokens=count, sampled_seqs=seqs))
    return batches


def calibrate(executor: Executor, config: Config, repeats: int,
              progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Time each synthetic step ``repeats`` times (after one untimed warm-up run);
    ``progress(done, total)`` is told after each step shape.

    Returns one row per step shape: the ``model_step`` batch features, ``interval_s`` (median wall
    seconds of the whole ``execute`` call: what a step costs the run), ``duration_s`` (median of
    what the executor measured, device time on a GPU) and ``wait_s`` (median time the host was
    blocked waiting for the device: ``interval_s - wait_s`` is the step's host work), with the
    10th and 90th percentiles of the interval.
    The KV blocks written are free and unindexed, so the run never reads them.
    """
    description = executor.describe()
    batches = calibration_batches(config, description.get("prefill_graph_tokens", []),
                                  bool(description.get("graph_batch_sizes")))
    rows = []
    for done, batch in enumerate(batches):
        if progress is not None:
            progress(done, len(batches))
        rows.append(time_batch(executor, batch, repeats))
    return rows


def time_batch(executor: Executor, batch: ScheduledBatch, repeats: int,
               clock: Callable[[], float] = time.perf_counter,
               deadline: float | None = None) -> dict[str, Any]:
    """One synthetic step timed ``repeats`` times after an untimed warm-up run: its
    ``model_step`` batch features and the medians and quantiles ``calibrate`` describes.
    ``clock``: wall seconds (a simulated clock for a law-timed executor). ``deadline`` (a
    ``clock`` time): no repeat starts past it once one is timed; the row's ``repeats`` says
    how many ran."""
    walls, durations, waits = [], [], []
    output = None
    for attempt in range(repeats + 1):
        if deadline is not None and walls and clock() >= deadline:
            break
        began = clock()
        output = executor.execute(batch)
        wall = clock() - began
        if attempt:  # the first run pays one-off compilation
            walls.append(wall)
            durations.append(output.duration_s if output.duration_s is not None else wall)
            waits.append(output.wait_s)
    assert output is not None and walls  # repeats >= 1 is validated by Config
    prefill_tokens, prefill_work, decode_seqs, decode_ctx = batch_features(batch)
    return {
        "kind": batch.kind,
        "num_seqs": len(batch.seqs),
        "prefill_tokens": prefill_tokens,
        "prefill_attn_work": prefill_work,
        "decode_seqs": decode_seqs,
        "decode_context_tokens": decode_ctx,
        "padded_batch_size": output.padded_batch_size or len(batch.seqs),
        "graph_used": bool(output.graph_used),
        "padded_tokens": output.padded_tokens,
        "interval_s": statistics.median(walls),
        "interval_p10_s": _quantile(walls, LOW_QUANTILE),
        "interval_p90_s": _quantile(walls, HIGH_QUANTILE),
        "duration_s": statistics.median(durations),
        "wait_s": statistics.median(waits),
        "repeats": len(walls),
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
