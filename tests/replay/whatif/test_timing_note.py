"""Session 32 (what-if and tune): a timing source (``--timing-from``) that ran another device or
model than the source recording is named beside it, both sides by device and model."""

from __future__ import annotations

from replay.whatif.cost.model import CostModel, recorded_model
from replay.whatif.notes import timing_note

H200_06B = {"device": "cuda:0", "executor": {"device_name": "NVIDIA H200"},
            "model": {"architecture": "Qwen3ForCausalLM", "path": "/a/qwen3-0.6b",
                      "num_params": 596049920, "dtype": "bfloat16"}}
CPU_TINY = {"device": "cpu", "executor": {"device_name": "cpu"},
            "model": {"architecture": "Qwen3ForCausalLM", "path": "/b/tiny",
                      "num_params": 10019648, "dtype": "float32"}}


def _timed(header: dict) -> CostModel:
    return CostModel(fits={}, source="T", device=header["executor"]["device_name"],
                     model_name=recorded_model(header))


def test_the_model_is_named_by_what_prices_its_steps_not_its_path() -> None:
    assert recorded_model(H200_06B) == "Qwen3ForCausalLM, 596M parameters, bfloat16"
    moved = {**H200_06B, "model": {**H200_06B["model"], "path": "/elsewhere"}}
    assert recorded_model(moved) == recorded_model(H200_06B)
    assert recorded_model({}) == ""


def test_another_device_and_model_are_both_named() -> None:
    note = timing_note(_timed(CPU_TINY), H200_06B, "traces/cpu-tiny-demo", "traces/h200")
    assert note is not None
    assert "--timing-from traces/cpu-tiny-demo ran Qwen3ForCausalLM, 10M parameters, " \
           "float32 on cpu" in note
    assert "traces/h200 recorded Qwen3ForCausalLM, 596M parameters, bfloat16 on NVIDIA H200" \
           in note
    assert "another device and model" in note and "not like for like" in note


def test_only_what_differs_is_said_and_the_same_gives_none() -> None:
    same = timing_note(_timed(H200_06B), {**H200_06B, "model": {**H200_06B["model"],
                                                                "path": "/x"}})
    assert same is None
    h100 = {**H200_06B, "executor": {"device_name": "NVIDIA H100 80GB HBM3"}}
    note = timing_note(_timed(H200_06B), h100)
    assert note is not None and "another device," in note
    other_model = {**H200_06B, "model": CPU_TINY["model"]}
    note = timing_note(_timed(H200_06B), other_model)
    assert note is not None and "another model," in note
    assert timing_note(None, H200_06B) is None


def test_a_model_saved_without_its_model_name_is_judged_by_its_device() -> None:
    """A cost model saved before ``model_name`` loads (the field has a default) and is named by
    its device only."""
    old = CostModel(fits={}, device="cpu")
    note = timing_note(old, H200_06B, "m.json", "S")
    assert note is not None and "a model it does not name on cpu" in note
    assert timing_note(CostModel(fits={}, device="NVIDIA H200"), H200_06B) is None
