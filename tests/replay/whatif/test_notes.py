"""A variant's notes name the settings its prediction does not model, instead of predicting
"no change" for them silently."""

from __future__ import annotations

from types import SimpleNamespace

from engine.config import Config
from replay.whatif.notes import (
    KERNEL_SPEED_FIELDS,
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


def test_kernel_and_unsimulated_fields_are_config_fields() -> None:
    names = set(Config.field_names())
    assert set(KERNEL_SPEED_FIELDS) <= names and set(UNSIMULATED_FIELDS) <= names
    assert not set(KERNEL_SPEED_FIELDS) & set(UNSIMULATED_FIELDS)


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
