"""Start-up calibration: time a few synthetic steps of sizes the run itself may never take.

A step-time model fitted on a run's own steps cannot see costs that only show in steps of another
shape: a run whose prefills are all large never reveals the launch-bound floor of a small eager
prefill, which a run under a tighter configuration (recomputing after preemptions) pays on every
one. Timing a ladder of prefill sizes and a few decode batches once, before the first request,
and recording them in the trace header makes those costs identifiable.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from engine.batch import ScheduledBatch
from engine.config import Config
from engine.engine_core import batch_features
from engine.executor import Executor
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

PREFILL_TOKENS = (1, 16, 128, 512, 2048)
DECODE_BATCHES = (1, 16, 64)
DECODE_CONTEXT = 256
# Calibration sequences get ids no request can have (requests count up from 0).
FIRST_CALIBRATION_SEQ_ID = -1000
# Token id fed to the synthetic prompts: an ordinary token of any Qwen vocabulary.
FILLER_TOKEN = 13
LOW_QUANTILE, HIGH_QUANTILE = 0.1, 0.9


def _sequences(count: int, length: int, first_block: int, block_size: int) -> list[Sequence]:
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    blocks_each = (length + block_size - 1) // block_size
    seqs = []
    for i in range(count):
        seq = Sequence(FIRST_CALIBRATION_SEQ_ID - i, [FILLER_TOKEN] * length, params)
        start = first_block + i * blocks_each
        seq.block_table = list(range(start, start + blocks_each))
        seqs.append(seq)
    return seqs


def calibration_batches(config: Config) -> list[ScheduledBatch]:
    """The synthetic steps that fit this configuration's pool, budget and model length."""
    block_size, num_blocks = config.kvcache_block_size, config.num_kvcache_blocks
    batches = []
    for tokens in PREFILL_TOKENS:
        blocks = (tokens + block_size - 1) // block_size
        if tokens > min(config.max_num_batched_tokens, config.max_model_len) or blocks > num_blocks:
            continue
        seqs = _sequences(1, tokens, 0, block_size)
        batches.append(ScheduledBatch(-1, "prefill", seqs, [tokens], [tokens], 1,
                                      num_batched_tokens=tokens, sampled_seqs=seqs))
    context = min(DECODE_CONTEXT, config.max_model_len - 1)
    blocks_each = (context + block_size - 1) // block_size
    for count in DECODE_BATCHES:
        if count > config.max_num_seqs or count * blocks_each > num_blocks:
            continue
        seqs = _sequences(count, context, 0, block_size)
        for seq in seqs:
            seq.num_computed_tokens = context - 1
        batches.append(ScheduledBatch(-1, "decode", seqs, [1] * count, [context] * count, 0,
                                      num_batched_tokens=count, sampled_seqs=seqs))
    return batches


def calibrate(executor: Executor, config: Config, repeats: int) -> list[dict[str, Any]]:
    """Time each synthetic step ``repeats`` times (after one untimed warm-up run).

    Returns one row per step shape: the ``model_step`` batch features, ``interval_s`` (median wall
    seconds of the whole ``execute`` call: what a step costs the run) and ``duration_s`` (median of
    what the executor measured, device time on a GPU), with their 10th and 90th percentiles.
    The KV blocks written are free and unindexed, so the run never reads them.
    """
    rows = []
    for batch in calibration_batches(config):
        walls, durations = [], []
        output = None
        for attempt in range(repeats + 1):
            began = time.perf_counter()
            output = executor.execute(batch)
            wall = time.perf_counter() - began
            if attempt:  # the first run pays one-off compilation
                walls.append(wall)
                durations.append(output.duration_s if output.duration_s is not None else wall)
        assert output is not None  # repeats >= 1 is validated by Config
        prefill_tokens, prefill_work, decode_seqs, decode_ctx = batch_features(batch)
        rows.append({
            "kind": batch.kind,
            "num_seqs": len(batch.seqs),
            "prefill_tokens": prefill_tokens,
            "prefill_attn_work": prefill_work,
            "decode_seqs": decode_seqs,
            "decode_context_tokens": decode_ctx,
            "padded_batch_size": output.padded_batch_size or len(batch.seqs),
            "graph_used": bool(output.graph_used),
            "interval_s": statistics.median(walls),
            "interval_p10_s": _quantile(walls, LOW_QUANTILE),
            "interval_p90_s": _quantile(walls, HIGH_QUANTILE),
            "duration_s": statistics.median(durations),
            "repeats": repeats,
        })
    return rows


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
