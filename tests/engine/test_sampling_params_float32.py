"""``SamplingParams`` holds temperature and top_p as the trace's float32 columns record them,
so ``LLM.generate`` decides on what a replay reads back (found by the server round of session
37; the server now takes the engine's rule). Before: a temperature of 1e-5 sampled, was recorded
as 9.99999975e-06, under ``GREEDY_BELOW``, and replayed greedy (verify diverged): the cut-off
is now compared in float32; 1e308 was
recorded as inf, and verify refused the trace; a top_p of 5e-324 was recorded as 0."""

from __future__ import annotations

import pytest

from engine import LLM
from engine.errors import InvalidRequestError
from engine.model.checkpoint import default_model_dir
from engine.sampling_params import GREEDY_BELOW, SamplingParams
from replay.verify import verify


def test_a_value_float32_rounds_across_a_threshold_is_held_as_recorded() -> None:
    assert GREEDY_BELOW == 1e-5
    # The cut-off is compared in float32: 1e-5 samples, and so does its float32 on replay.
    at = SamplingParams(temperature=1e-5).temperature
    assert at > 0 and SamplingParams(temperature=at).temperature == at
    assert SamplingParams(temperature=0.99999e-5).temperature == 0.0
    assert SamplingParams(temperature=1e-300).temperature == 0.0  # float32 flushes it: greedy
    assert SamplingParams(top_p=0.99999999).top_p == 1.0
    assert not SamplingParams(temperature=0.7, top_p=0.99999999).needs_row_sampling
    assert SamplingParams(temperature=0.7).temperature == pytest.approx(0.7, rel=1e-7)


@pytest.mark.parametrize(("name", "value"), [("temperature", 1e308), ("top_p", 5e-324)])
def test_a_value_float32_cannot_hold_is_refused(name: str, value: float) -> None:
    with pytest.raises(InvalidRequestError) as exc:
        SamplingParams(**{name: value})
    assert str(exc.value).startswith(f"{name} {value!r} is outside what the trace's float32 "
                                     "column holds")


def test_a_run_at_such_a_temperature_replays_identically(tmp_path) -> None:
    out = tmp_path / "trace"
    llm = LLM(str(default_model_dir()), device="cpu", num_kvcache_blocks=64,
              kvcache_block_size=16, max_model_len=256, trace_dir=str(out))
    llm.generate([[11, 22, 33, 44]], SamplingParams(temperature=1.00000001e-5, max_tokens=6,
                                                    seed=3, ignore_eos=True), use_tqdm=False)
    llm.close()
    assert verify(out).identical
