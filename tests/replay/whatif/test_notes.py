"""A variant's notes name the settings its prediction does not model, instead of predicting
"no change" for them silently."""

from __future__ import annotations

from types import SimpleNamespace

from engine.config import Config
from replay.whatif.notes import (
    KERNEL_SPEED_FIELDS,
    RECORDING_ONLY_FIELDS,
    UNSIMULATED_FIELDS,
    device_note,
    variant_notes,
)
from tracing.header import recorded_device

EXECUTOR = SimpleNamespace(synthesized=0, overlapped_steps=0, steps=10)


def test_an_unchanged_variant_has_no_notes() -> None:
    assert variant_notes(Config(), Config(), None, EXECUTOR) == []


def test_kernel_speed_settings_are_named_with_the_recorded_value() -> None:
    """Turning the split-K GEMMs on for a trace recorded without them is not a prediction: the
    note says the step times are the source's, and what the source ran."""
    source = Config(split_k_gemm=False)
    (note,) = variant_notes(source, Config(split_k_gemm=True), None, EXECUTOR)
    assert note.startswith("split_k_gemm: kernel speed only")
    assert "recorded with split_k_gemm=False" in note
    (note,) = variant_notes(Config(), Config(fused_kernels=False, blas_library="cublaslt"),
                            None, EXECUTOR)
    assert note.startswith("fused_kernels, blas_library:")


# The fields a simulated variant runs as set: its scheduler's decisions (and the pool, the
# graphs' padding) follow them.
SIMULATED_FIELDS = {
    "model", "max_num_batched_tokens", "max_num_seqs", "max_model_len", "enforce_eager",
    "kvcache_block_size", "num_kvcache_blocks", "policy", "eviction", "enable_prefix_caching",
    "prefix_cache_duplicates", "eos", "async_scheduling", "prefill_graph_tokens",
    "prefill_graph_seqs", "defer_block_rule", "overlap_mixed_steps",
}


def test_every_config_field_is_classified_once() -> None:
    """Each Config field is simulated, or named by a note when a variant changes it (not
    simulated, kernel speed only, or recording only): a new field must say which, or a
    variant setting it would read as a prediction of "no change" silently."""
    groups = [SIMULATED_FIELDS, set(UNSIMULATED_FIELDS), set(KERNEL_SPEED_FIELDS),
              set(RECORDING_ONLY_FIELDS)]
    assert set().union(*groups) == set(Config.field_names())
    assert sum(len(g) for g in groups) == len(Config.field_names())


def test_settings_a_prediction_cannot_see_are_named() -> None:
    """``--set seed=7`` (or hash_seed, the trace's flush settings, calibration_repeats) gave a
    prediction identical to the recording with no word: a real run would draw other tokens."""
    (note,) = variant_notes(Config(), Config(seed=7, trace_flush_steps=3), None, EXECUTOR)
    assert note.startswith("seed, trace_flush_steps: no effect on this prediction")


def test_prefill_graphs_larger_than_the_source_captured_are_named() -> None:
    """A variant whose prefill graphs go past the source's (more tokens, more prompts) is told
    which of its prefills are simulated eager, as the source ran them."""
    from replay.whatif.cost.model import CostModel

    cost = CostModel(fits={}, prefill_graph_sizes=[16, 4096], prefill_graph_max_seqs=16)
    source = Config(prefill_graph_tokens=4096, prefill_graph_seqs=16)
    notes = variant_notes(source, Config(prefill_graph_tokens=16384, prefill_graph_seqs=64),
                          cost, EXECUTOR)
    assert len(notes) == 2
    assert "captured them up to 4,096" in notes[0]
    assert "may take 64 prompts here, the timing source's took 16" in notes[1]
    assert variant_notes(source, source, cost, EXECUTOR) == []
    assert variant_notes(source, Config(prefill_graph_tokens=4096, prefill_graph_seqs=8), cost,
                         EXECUTOR) == []  # fewer than the source's: simulated as asked
    # Graphs of at most 32 tokens hold at most 32 prompts, whatever prefill_graph_seqs says:
    # the unchanged variant of such a source (its runner took 32) gets no note.
    small = Config(prefill_graph_tokens=32, prefill_graph_seqs=64)
    tiny = CostModel(fits={}, prefill_graph_sizes=[16, 32], prefill_graph_max_seqs=32)
    assert variant_notes(small, small, tiny, EXECUTOR) == []


def test_a_recording_on_another_device_is_noted() -> None:
    """A recording compared with a prediction whose timing source ran on another device gets a
    note naming both (the prediction prices the source's device); the same device, or a side
    that does not say, none. The device is the executor's name for it where there is one."""
    h100 = {"device": "cuda:0", "executor": {"device_name": "NVIDIA H100 80GB HBM3"}}
    assert recorded_device(h100) == "NVIDIA H100 80GB HBM3"
    assert recorded_device({"device": "cpu", "executor": {}}) == "cpu"
    assert recorded_device({}) == ""
    on_h200 = SimpleNamespace(device="NVIDIA H200")
    note = device_note(on_h200, h100)
    assert note is not None
    assert "recorded on NVIDIA H100 80GB HBM3, the timing source on NVIDIA H200" in note
    assert device_note(on_h200, {"executor": {"device_name": "NVIDIA H200"}}) is None
    assert device_note(SimpleNamespace(device=""), h100) is None
    assert device_note(None, h100) is None
    assert device_note(on_h200, {}) is None
