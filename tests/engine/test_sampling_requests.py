"""Per-request sampling on the tiny model: seeds, top-p/top-k, stop strings; recorded in
request_added (schema 5), stop recorded as a finish and replayed at its step."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import InvalidRequestError
from replay.verify import verify
from replay.whatif.simulate import simulate
from tracing import read_trace
from tracing.schema import NO_SEED, decode_stop

PROMPTS = [[11, 12, 13, 14, 15], [200, 201, 202], [7, 8, 9, 10, 11, 12, 13], [500, 600]]


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_p", 0.0), ("top_p", 1.5), ("top_k", -1), ("seed", -3), ("seed", 2**63),
     ("stop", "x"), ("stop", ("",)), ("temperature", True), ("temperature", float("inf")),
     ("top_k", 2**31), ("stop", ("\ud800",))],
)
def test_invalid_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**{field: value})


def test_a_temperature_too_small_to_divide_by_samples_greedily(llm: LLM, tmp_path: Path) -> None:
    """A positive temperature below ``GREEDY_BELOW`` (logits over it overflow float32, and the
    softmax of infinities is NaN: token 0 every time) runs and is recorded as greedy."""
    from engine.sampling_params import GREEDY_BELOW

    assert SamplingParams(temperature=GREEDY_BELOW / 10).temperature == 0.0
    # As the trace's float32 holds it (tests/engine/test_sampling_params_float32.py).
    assert SamplingParams(temperature=GREEDY_BELOW).temperature == pytest.approx(GREEDY_BELOW)
    tiny = llm.generate(PROMPTS, SamplingParams(temperature=1e-300, max_tokens=8))
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8))
    assert [o["token_ids"] for o in tiny] == [o["token_ids"] for o in greedy]
    recorder = LLM(None, trace_dir=str(tmp_path / "t"), calibration_repeats=0)
    recorder.generate(PROMPTS[:1], SamplingParams(temperature=1e-300, max_tokens=4))
    recorder.close()
    assert read_trace(str(tmp_path / "t")).df("request_added").temperature.tolist() == [0.0]


def test_a_seeded_answer_does_not_depend_on_its_batch(llm: LLM) -> None:
    """The same prompt and seed give the same tokens alone and batched with others (and with
    the engine's generator in another state); another seed gives another answer."""
    seeded = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=1234)
    alone = llm.generate([PROMPTS[0]], seeded, use_tqdm=False)[0]["token_ids"]
    others = SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True)
    batch = llm.generate(PROMPTS[1:3] + [PROMPTS[0]], [others, others, seeded],
                         use_tqdm=False)
    assert batch[2]["token_ids"] == alone
    other_seed = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=99)
    assert llm.generate([PROMPTS[0]], other_seed, use_tqdm=False)[0]["token_ids"] != alone


def test_top_k_one_is_greedy(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    top1 = SamplingParams(temperature=2.0, max_tokens=8, ignore_eos=True, top_k=1)
    assert [o["token_ids"] for o in llm.generate(PROMPTS, top1, use_tqdm=False)] == [
        o["token_ids"] for o in llm.generate(PROMPTS, greedy, use_tqdm=False)
    ]


def _stop_for(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[str, str]:
    """A stop string inside the free-running text, and the text before it."""
    text = llm.generate([prompt], params, use_tqdm=False)[0]["text"]
    assert len(text) > 12
    stop = text[6:9]
    return stop, text[: text.find(stop)]


def test_a_stop_string_ends_the_text_and_is_recorded(llm: LLM, tmp_path: Path) -> None:
    """The text ends before the stop string; the trace records the settings and the finish
    (reason stop, fewer tokens than max_tokens); it verifies and the simulator re-runs it."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    stop, before = _stop_for(llm, PROMPTS[0], params)
    traced = LLM(None, trace_dir=str(tmp_path / "t"), calibration_repeats=0)
    try:
        stopping = SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True, top_p=0.9,
                                  top_k=50, seed=7, stop=(stop,))
        greedy_stop = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                                     stop=(stop,))
        out = traced.generate([PROMPTS[1], PROMPTS[0]], [stopping, greedy_stop],
                              use_tqdm=False)
    finally:
        traced.close()
    assert out[1]["text"] == before
    assert out[1]["finish_reason"] == "stop"
    trace = read_trace(tmp_path / "t")
    added = trace.table("request_added").to_pandas()
    assert added["top_p"].tolist() == pytest.approx([0.9, 1.0])
    assert added["top_k"].tolist() == [50, 0]
    assert added["seed"].tolist() == [7, NO_SEED]
    assert [decode_stop(s) for s in added["stop"]] == [(stop,), (stop,)]
    finished = trace.table("request_finished").to_pandas().set_index("seq_id")
    assert finished.loc[1, "reason"] == "stop"
    assert finished.loc[1, "num_completion_tokens"] < 24
    assert verify(tmp_path / "t").identical
    sim = simulate(str(tmp_path / "t"))
    assert sim.ok and sim.events is not None
    reasons = sim.events.tables["request_finished"]["reason"].tolist()
    assert "stop" in reasons


def test_the_incremental_text_equals_the_whole_decode(llm: LLM) -> None:
    """Token by token, the emitted pieces join to ``tokenizer.decode`` of all tokens, also
    when tokens split UTF-8 characters; with a stop string, to the text before it."""
    import random

    rng = random.Random(0)
    tokenizer = llm.tokenizer
    for _ in range(50):
        ids = [rng.randrange(llm.vocab_size) for _ in range(rng.randint(1, 30))]
        detok = IncrementalDetokenizer(tokenizer)
        pieces = [detok.add([t]) for t in ids]
        assert "".join(pieces) + detok.finish() == tokenizer.decode(ids)
        full = tokenizer.decode(ids)
        if len(full) > 8 and "\ufffd" not in full:
            stop = full[4:7]
            detok = IncrementalDetokenizer(tokenizer, [stop])
            text = "".join(detok.add([t]) for t in ids) + detok.finish()
            assert text == full[: full.find(stop)]
            assert detok.stopped
