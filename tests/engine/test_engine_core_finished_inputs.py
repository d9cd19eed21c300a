"""An outside finish (an abort, a stop string) naming a request that has already finished, or
that ``EngineCore.forget`` dropped, changes nothing: the recording still verifies.

Before: ``EngineCore.finish`` resolved the step in flight and cleared "the last step was
deferred" before looking at the request, so aborting a finished request (a client that leaves
as its answer ends, a stop string completed by a request's last token) marked the next step
``overlapped=False`` where replay, which never sees such an input, decided ``True``: ``verify``
failed on a correct recording. And an abort naming a forgotten request raised ``KeyError``,
though ``forget`` says later inputs naming it are ignored.
"""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from replay.verify import verify, verify_events
from tracing.sink import MemorySink


def _core() -> EngineCore:
    config = Config(num_kvcache_blocks=64, kvcache_block_size=4, max_model_len=64,
                    max_num_batched_tokens=64)
    return EngineCore(config, NullExecutor(64, overlap=True), sink=MemorySink())


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.6, max_tokens=max_tokens, ignore_eos=True)


def test_aborting_a_finished_request_changes_no_decision() -> None:
    """A request that finished by length (in a deferred step, its tokens maybe still on the
    way) is aborted while another decodes: the recording verifies, the other's steps stay
    marked overlapped, and the finished one keeps reason ``length``."""
    core = _core()
    short = core.add_request([1, 2, 3, 4, 5], _params(3))
    core.add_request([6, 7, 8], _params(12))
    while not short.is_finished:
        core.step()
    core.abort(short.seq_id)  # may be one call before its step's result is returned
    core.step()
    core.abort(short.seq_id)  # and again once it has been returned
    core.run_until_idle()
    core.close()
    sink = core.sink
    assert short.finish_reason == "length"
    assert sink.tables["request_finished"]["reason"] == ["length", "length"]
    flags = sink.tables["model_step"]["overlapped"]
    assert all(flags[2:]), f"the decode steps after the abort are overlapped: {flags}"
    result = verify_events(sink.header, sink.tables)
    assert result.identical, result.report()


def test_an_abort_naming_a_forgotten_request_is_ignored() -> None:
    """``forget`` promises that later inputs naming the request are ignored; an abort raised
    ``KeyError``. A seq id this engine never gave out is still an error."""
    core = _core()
    done = core.add_request([1, 2, 3], _params(1))
    core.add_request([4, 5, 6], _params(6))
    while not done.is_finished:
        core.step()
    core.forget(done.seq_id)
    core.abort(done.seq_id)
    core.run_until_idle()
    core.close()
    result = verify_events(core.sink.header, core.sink.tables)
    assert result.identical, result.report()
    with pytest.raises(KeyError, match="no request 99"):
        core.abort(99)


def test_a_stop_string_completed_by_the_last_token_verifies(tmp_path: object) -> None:
    """``generate`` with a stop string that the request's last allowed token completes (it
    finished by length in that step) while a longer request keeps decoding: the trace verifies.
    It diverged at the next step's ``overlapped`` flag."""
    greedy = {"temperature": 0.0, "ignore_eos": True}
    trace = f"{tmp_path}/trace"
    with LLM(None, trace_dir=trace, calibration_repeats=0, kvcache_block_size=4,
             num_kvcache_blocks=64) as llm:
        ref = llm.generate(["Hello world"], SamplingParams(max_tokens=4, **greedy),
                           use_tqdm=False)[0]
        last = llm.tokenizer.decode(ref["token_ids"][-1:])
        assert last.strip(), "the last token's text must be a usable stop string"
        outs = llm.generate(
            ["Hello world", "The quick brown fox"],
            [SamplingParams(max_tokens=4, stop=(last,), **greedy),
             SamplingParams(max_tokens=12, **greedy)],
            use_tqdm=False,
        )
    assert outs[0]["token_ids"] == ref["token_ids"]
    assert len(outs[1]["token_ids"]) == 12
    result = verify(trace)
    assert result.identical, result.report()
