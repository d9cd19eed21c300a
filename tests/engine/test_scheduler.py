"""Nano-vLLM's scheduling behaviour, checked decision by decision on small hand-made cases."""

from __future__ import annotations

import pytest

from engine.config import Config
from engine.engine_core import EngineCore
from engine.errors import ConfigError, InvalidRequestError
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from tracing.sink import MemorySink

BLOCK = 4


def make_core(num_blocks: int = 64, **config: object) -> tuple[EngineCore, MemorySink]:
    settings = {"kvcache_block_size": BLOCK, "max_model_len": 256, "max_num_batched_tokens": 256}
    settings.update(config)
    cfg = Config(num_kvcache_blocks=num_blocks, **settings)
    sink = MemorySink()
    return EngineCore(cfg, NullExecutor(num_blocks, vocab_size=1000), sink=sink), sink


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def test_prefill_runs_before_decode_and_batches_waiting_prompts() -> None:
    """New prompts are prefilled together in one step; decode steps follow (prefill first)."""
    core, _ = make_core()
    for base, n in ((0, 5), (100, 9), (200, 3)):
        core.add_request(list(range(base, base + n)), greedy(3))
    first = core.step()
    assert first is not None and first.batch.kind == "prefill"
    assert [s.seq_id for s in first.batch.seqs] == [0, 1, 2]
    assert first.batch.num_new_tokens == [5, 9, 3]
    core.add_request([7, 7, 7], greedy(2))
    second = core.step()
    assert second is not None and second.batch.kind == "prefill"
    assert [s.seq_id for s in second.batch.seqs] == [3]
    third = core.step()
    assert third is not None and third.batch.kind == "decode" and len(third.batch.seqs) == 4


def test_prefix_cache_hit_and_last_block_recomputed() -> None:
    """A shared full-block prefix is hit; a completely cached prompt still computes a block."""
    core, sink = make_core()
    prompt = list(range(100, 108))  # two full blocks
    core.add_request(prompt, greedy(1))
    core.run_until_idle()
    core.add_request(prompt + [5, 6], greedy(1))
    step = core.step()
    assert step is not None and step.batch.num_new_tokens == [2]  # 8 of 10 tokens cached
    core.run_until_idle()
    core.add_request(prompt, greedy(1))  # every block cached: the last one is recomputed
    step = core.step()
    assert step is not None and step.batch.num_new_tokens == [BLOCK]
    core.close()
    hits = sink.tables["block_hit"]
    assert hits["seq_id"] == [1, 1, 2]
    assert hits["logical_index"] == [0, 1, 0]


def test_freed_block_stays_hittable_until_reused() -> None:
    """After its owner finishes, a cached block is free but a later equal prefix still hits it."""
    core, sink = make_core(num_blocks=8)
    core.add_request(list(range(8)) + [99], greedy(1))
    core.run_until_idle()
    assert len(core.scheduler.block_manager.free_block_ids) == 8
    core.add_request(list(range(8)) + [42], greedy(1))
    core.run_until_idle()
    core.close()
    hit_blocks = sink.tables["block_hit"]["block_id"]
    first_blocks = sink.tables["block_allocated"]["block_id"][:2]
    assert hit_blocks == first_blocks


def test_reused_block_is_no_longer_hittable() -> None:
    """Once a free cached block is handed out again, its old contents cannot be hit."""
    core, sink = make_core(num_blocks=3)
    core.add_request(list(range(8)), greedy(1))  # blocks 0,1 (1 recomputed), hashed
    core.run_until_idle()
    core.add_request([500 + i for i in range(9)], greedy(1))  # needs all 3 blocks
    core.run_until_idle()
    core.add_request(list(range(8)) + [1], greedy(1))
    core.run_until_idle()
    core.close()
    assert sink.tables["block_hit"]["seq_id"] == []


def test_preempts_most_recent_running_sequence_and_recomputes() -> None:
    """When a decode needs a block and none is free, the newest running sequence is preempted,
    then re-prefilled (recompute) and finishes with every token it asked for."""
    core, sink = make_core(num_blocks=6)
    for base in (0, 100, 200):
        core.add_request([base + i for i in range(7)], greedy(6))  # 2 blocks each
    core.run_until_idle()
    core.close()
    pre = sink.tables["preempted"]
    assert pre["seq_id"], "the pool of 6 blocks must force a preemption"
    assert pre["seq_id"][0] == 2 and pre["for_seq_id"][0] == 0
    finished = sink.tables["request_finished"]
    assert sorted(finished["seq_id"]) == [0, 1, 2]
    assert set(finished["num_completion_tokens"]) == {6}
    assert len(core.scheduler.block_manager.free_block_ids) == 6


def test_bad_requests_are_rejected_and_others_complete() -> None:
    """Empty prompt, prompt over max_model_len and a request larger than the pool are each
    rejected with a reason naming the problem; the good requests still finish."""
    core, sink = make_core(num_blocks=8, max_model_len=40, max_num_batched_tokens=64)
    good = core.add_request([1, 2, 3], greedy(4))
    empty = core.add_request([], greedy(4))
    too_long = core.add_request(list(range(41)), greedy(4))
    too_big = core.add_request(list(range(20)), greedy(20))  # 39 tokens -> 10 blocks > 8
    core.run_until_idle()
    core.close()
    assert core.rejections[empty.seq_id] == "empty prompt"
    assert "max_model_len=40" in core.rejections[too_long.seq_id]
    assert "whole pool has 8" in core.rejections[too_big.seq_id]
    assert good.seq_id not in core.rejections and good.num_completion_tokens == 4
    reasons = dict(zip(sink.tables["request_finished"]["seq_id"],
                       sink.tables["request_finished"]["reason"]))
    assert reasons == {0: "length", 1: "rejected", 2: "rejected", 3: "rejected"}


def test_sequence_reaching_max_model_len_finishes_with_length() -> None:
    """A sequence that would grow past max_model_len stops there with reason 'length'."""
    core, _ = make_core(max_model_len=12, max_num_batched_tokens=12)
    seq = core.add_request(list(range(10)), greedy(100))
    core.run_until_idle()
    assert seq.finish_reason == "length" and len(seq) == 12


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", -0.5), ("max_tokens", 0), ("max_tokens", 1.5)],
)
def test_invalid_sampling_params_name_the_field(field: str, value: object) -> None:
    """temperature < 0 and max_tokens < 1 raise a clear error naming the field."""
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**{field: value})


def test_config_rejects_out_of_range_values_with_the_range() -> None:
    """Each Config field is validated; the message names the field and the accepted range."""
    with pytest.raises(ConfigError, match=r"max_num_seqs must be int in \[1,"):
        Config(max_num_seqs=0)
    with pytest.raises(ConfigError, match="policy must be one of"):
        Config(policy="fastest")
    with pytest.raises(ConfigError, match="unknown config key"):
        Config().replace(max_seqs=3)
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        Config(max_num_batched_tokens=100, max_model_len=200)


def test_chunked_policy_splits_long_prompts_and_mixes_decodes() -> None:
    """Under 'chunked', a prompt longer than the token budget is prefilled over several steps
    while running sequences keep decoding in the same (mixed) batches."""
    core, sink = make_core(policy="chunked", max_num_batched_tokens=8, max_model_len=64)
    core.add_request([1, 2, 3], greedy(10))
    core.step()
    core.add_request(list(range(20)), greedy(2))
    kinds = []
    while (result := core.step()) is not None:
        kinds.append(result.batch.kind)
        assert result.batch.num_batched_tokens <= 8
    core.close()
    assert "mixed" in kinds
    finished = dict(zip(sink.tables["request_finished"]["seq_id"],
                        sink.tables["request_finished"]["num_completion_tokens"]))
    assert finished == {0: 10, 1: 2}
