"""Notes on a simulated variant: where its prediction rests on assumptions the source cannot
check (synthetic tokens, unsimulated settings, step classes the timing source never ran)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.config import Config
from engine.graph_sizes import prefill_graph_limit, prefill_graph_prompts
from replay.whatif.cost.model import CostModel, recorded_model
from replay.whatif.sim_executor import SimExecutor
from tracing.header import recorded_device

CANNOT_RUN = "cannot run"  # the status of a variant whose engine cannot serve its workload
# Config fields that change neither a scheduling decision nor the simulated executor: an
# override of one is reported, not silently taken as a prediction.
UNSIMULATED_FIELDS = (
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "kv_cache_bytes",
    "dtype",
    "attention_backend",
    "freeze_gc_heap",
    "device",  # the timing source's device prices every step (a profile prices another)
)
# Config fields that change what a real run draws or writes, but nothing a prediction
# replays: the sampler's and the block hashes' seeds (the simulation keeps the source's tokens,
# and a hash's value decides nothing), how the trace is written, the start-up calibration.
RECORDING_ONLY_FIELDS = (
    "seed",
    "hash_seed",
    "trace_flush_steps",
    "trace_flush_seconds",
    "trace_segment_writer",
    "calibration_repeats",
)
# Config fields that change only how fast the GPU kernels run (numerics, not decisions): the
# cost model takes its step times from the timing source, recorded under the source's values.
KERNEL_SPEED_FIELDS = (
    "fused_kernels",
    "fused_kv_store",
    "blas_library",
    "split_k_gemm",
    "decode_gemm_prefetch",
    "decode_qk_prologue",
    "programmatic_launch",
    "decode_longest_first",
    "long_prefill_kernel",
)


def device_note(cost: CostModel | None, recorded: Mapping[str, Any]) -> str | None:
    """A note where a recording compared with a prediction ran on another device than the
    timing source: the prediction prices the source's device, not the recording's."""
    theirs = recorded_device(recorded)
    if cost is None or not cost.device or not theirs or theirs == cost.device:
        return None
    return (f"recorded on {theirs}, the timing source on {cost.device}: the prediction prices "
            "the source's device (a profile or a source recorded on that device prices it)")


def timing_note(cost: CostModel | None, recorded: Mapping[str, Any], timing: str = "",
                source: str = "the source") -> str | None:
    """A note where the timing source (``timing``: ``--timing-from``'s name) ran another device
    or model than the source recording (``recorded``: its header; ``source``: its name): the
    predictions price the timing source's, so the recording's own figures (whatif's recorded
    row) are no like-for-like measure of them. Both sides named by device and model; a side
    that does not say (a model saved before ``model_name``) is taken as the same."""
    if cost is None:
        return None
    ours, theirs = recorded_device(recorded), recorded_model(recorded)
    other_device = bool(cost.device and ours and cost.device != ours)
    other_model = bool(cost.model_name and theirs and cost.model_name != theirs)
    if not (other_device or other_model):
        return None
    what = " and ".join(w for w, differs in (("device", other_device), ("model", other_model))
                        if differs)
    return (f"--timing-from {timing or cost.source or 'its model'} ran "
            f"{_named(cost.device, cost.model_name)}; {source} recorded {_named(ours, theirs)}: "
            f"another {what}, so the predictions (priced on the former) are not like for like "
            "with the recorded figures")


def _named(device: str, model: str) -> str:
    return f"{model or 'a model it does not name'} on {device or 'a device it does not name'}"


def _prefill_graph_notes(source: Config, config: Config, cost: CostModel) -> list[str]:
    """Where the variant's prefill graphs differ from what the timing source can price."""
    limit = prefill_graph_limit(config)
    sizes = cost.prefill_graph_sizes
    notes = []
    # (Only where asked for: a source run on a CPU, say, had the setting but captured nothing.)
    asked = config.prefill_graph_tokens != source.prefill_graph_tokens
    if limit and not sizes and asked:
        notes.append(f"prefill_graph_tokens={config.prefill_graph_tokens}: the timing source "
                     "captured no prefill CUDA graphs (their sizes and times are unknown): "
                     "every prefill is simulated eager")
    elif sizes and limit > sizes[-1]:
        notes.append(f"prefills of up to {limit:,} tokens may run through CUDA graphs here, the "
                     f"timing source captured them up to {sizes[-1]:,}: larger ones are "
                     "simulated eager")
    prompts = prefill_graph_prompts(config)
    if sizes and prompts > cost.prefill_graph_max_seqs:
        notes.append(f"a prefill graph may take {prompts} prompts here, the "
                     f"timing source's took {cost.prefill_graph_max_seqs}: a prefill of more is "
                     "simulated eager")
    # (A variant's graph prefills priced without a fit of their own: coverage_warnings says so.)
    return notes


def variant_notes(source: Config, config: Config, cost: CostModel | None,
                  executor: SimExecutor) -> list[str]:
    """What a reader of the variant's prediction should know (one line each)."""
    notes = []
    if executor.synthesized:
        notes.append(f"{executor.synthesized} sampled tokens are synthetic (not in the source)")
    if cost is not None and cost.overlap is None and executor.overlapped_steps:
        notes.append(f"{executor.overlapped_steps} of {executor.steps} steps were launched "
                     "overlapped, but the timing source records no host time (interval mode): "
                     "each is charged a whole interval as the source's steps took, whatever "
                     "overlap saves")
    if cost is not None and config.enforce_eager and "decode_eager" not in cost.fits:
        # Named by the fit the model then takes (``CostModel.fallback``): a source of few
        # steps may have no graph decodes either (its one fit pooled).
        notes.append("the timing source has no eager decodes: predicted from "
                     f"{cost.fallback('decode_eager') or 'its decode fit'}")
    changed = [k for k in UNSIMULATED_FIELDS if getattr(source, k) != getattr(config, k)]
    if changed:
        notes.append(f"{', '.join(changed)}: not simulated (no effect on scheduling; step times "
                     "are the timing source's); the KV pool is num_kvcache_blocks")
    recording = [k for k in RECORDING_ONLY_FIELDS if getattr(source, k) != getattr(config, k)]
    if recording:
        notes.append(f"{', '.join(recording)}: no effect on this prediction (the simulation "
                     "keeps the source's tokens and step times; a real run would draw other "
                     "tokens with another seed, or write its trace otherwise)")
    kernels = [k for k in KERNEL_SPEED_FIELDS if getattr(source, k) != getattr(config, k)]
    if kernels:
        recorded = ", ".join(f"{k}={getattr(source, k)}" for k in kernels)
        notes.append(f"{', '.join(kernels)}: kernel speed only, not re-priced: step times are "
                     f"the timing source's, recorded with {recorded} (record or profile the "
                     "engine with the new setting to predict it)")
    if cost is not None:
        notes += _prefill_graph_notes(source, config, cost)
    if config.kvcache_block_size != source.kvcache_block_size and (
        config.num_kvcache_blocks == source.num_kvcache_blocks
    ):
        tokens = config.num_kvcache_blocks * config.kvcache_block_size
        before = source.num_kvcache_blocks * source.kvcache_block_size
        notes.append(f"kvcache_block_size changed with num_kvcache_blocks kept: the pool holds "
                     f"{tokens} tokens, not {before}")
    return notes


def simulated_note(header: Mapping[str, Any], name: str, use: str) -> str | None:
    """Where a trace given as ``use`` (``source``, ``timing source``) was written by a
    simulation (``whatif --trace-out``: its header's ``simulated_from``), not recorded: its
    step times are an earlier prediction's (None for a recording)."""
    origin = header.get("simulated_from")
    if origin is None:
        return None
    model = (header.get("executor") or {}).get("cost_model")
    times = f"step-time model of {model}" if model else "no step-time model"
    what = "step times" if use != "source" else "step times and 'recorded' row"
    return (f"the {use} {name} is a simulated trace (of {origin}, {times}), not a recording: "
            f"its {what} are an earlier prediction's")


def never_scheduled(count: int, total: int, first: str) -> str:
    """The status of a variant that cannot serve ``count`` of ``total`` requests (``first``:
    the first one and the engine's reason)."""
    return f"{CANNOT_RUN}: {count} of {total} requests can never be scheduled ({first})"


def rejected_note(count: int, total: int, first: str) -> str:
    """The note of a workload-file variant whose engine rejected ``count`` of ``total``
    requests it can never serve, as a live run rejects them (``Scheduler.admission_error``):
    the rest are predicted, these counted (the summary's ``rejected``) and not served."""
    return (f"{count} of {total} requests rejected by this configuration, as a live run "
            f"rejects them ({first}); the others are predicted, without them")
