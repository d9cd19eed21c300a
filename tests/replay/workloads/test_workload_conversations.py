"""Conversations depend on the server: turn k+1 goes out a think time after turn k finished, its
prompt turn k's prompt + answer + new tokens. The live engine and the simulator feed workloads
through one ``WorkloadInputs``: the same turn-by-turn prompts and prefix-cache hits; a slower
(simulated) engine sends later turns later."""

from __future__ import annotations

import numpy as np
import pytest

from engine import LLM
from engine.config import Config
from replay.cli.live import run_workload
from replay.whatif.cost.model import CostModel
from replay.whatif.simulate import run_variant, workload_from_requests
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.distributions import parse
from replay.workloads.generate import GenerateSpec, Generator
from replay.workloads.request import Request

BLOCK = 16
SETTINGS = dict(kvcache_block_size=BLOCK, num_kvcache_blocks=256, max_model_len=1024,
                max_num_batched_tokens=1024, max_num_seqs=8)


def conversations(num: int = 3, turns: int = 3, think: str = "fixed:0.05") -> list[Request]:
    """Three 3-turn conversations sharing one of two system prompts."""
    spec = GenerateSpec(num_requests=num, prompt_len=parse("uniform:20,40"),
                        output_len=parse("uniform:5,12"), system_prompts=2,
                        system_prompt_len=parse("fixed:32"), turns=parse(f"fixed:{turns}"),
                        think_time_s=parse(think), user_len=parse("uniform:8,20"),
                        temperature=0.0, seed=3)
    return list(Generator(spec))


def by_request(tables: dict, index_of_seq: dict[int, int]) -> tuple[dict, dict, dict]:
    """Per workload request: its prompt, its prefix-cache hit blocks and its arrival."""
    added = tables["request_added"]
    prompts = {index_of_seq[s]: list(p) for s, p in zip(added["seq_id"],
                                                         added["prompt_token_ids"])}
    arrivals = {index_of_seq[s]: float(a) for s, a in zip(added["seq_id"], added["arrival_s"])}
    hits = dict.fromkeys(prompts, 0)
    for s in tables["block_hit"]["seq_id"]:
        hits[index_of_seq[int(s)]] += 1
    return prompts, hits, arrivals


def test_live_and_simulated_conversations_send_the_same_prompts_and_hit_alike() -> None:
    requests = conversations()
    llm = LLM(None, **SETTINGS)
    try:
        seqs = run_workload(llm, requests, use_tqdm=False)
        live_tables = llm.core.events.tables
        live_index = {seq.seq_id: i for i, seq in enumerate(seqs)}
        live = by_request(live_tables, live_index)
        answers = [list(seq.completion_token_ids) for seq in seqs]
        config = llm.config
    finally:
        llm.close()
    assert len(seqs) == len(requests)
    # Turn k+1's prompt is turn k's prompt, its answer, then the new user tokens.
    prompts, hits, _ = live
    for index, request in enumerate(requests):
        if request.follows_previous_turn:
            before = prompts[index - 1] + answers[index - 1]
            assert prompts[index] == before + request.prompt_token_ids()
            assert hits[index] >= len(before) // BLOCK - 1 > 0  # the history came from cache
    workload = workload_from_requests(requests, config, "conversations")
    for sim_request, answer in zip(workload.requests, answers):
        sim_request.tokens = answer  # the simulator answers what the live run answered
    result = run_variant(workload, {}, cost=None)
    assert result.ok and result.events is not None
    sim_seqs = result.events.tables["request_added"]["seq_id"]
    # Simulated sequence ids follow submission order; map them by prompt to workload requests.
    by_prompt = {tuple(p): i for i, p in live[0].items()}
    sim_index = {int(s): by_prompt[tuple(p)] for s, p in
                 zip(sim_seqs, result.events.tables["request_added"]["prompt_token_ids"])}
    simulated = by_request(result.events.tables, sim_index)
    assert simulated[0] == live[0], "turn-by-turn prompts"
    assert simulated[1] == live[1], "prefix-cache hit blocks per turn"


def _cost(law: StepLaw) -> CostModel:
    config = Config(num_kvcache_blocks=400, max_num_seqs=64)
    return CostModel.fit(record_workload(config, reference_workload(num_seqs=24), law, seed=1))


@pytest.fixture(scope="module")
def fast_and_slow() -> tuple[CostModel, CostModel]:
    fast = StepLaw(noise=0.0, flush_every=0)
    slow = StepLaw(base_s=fast.base_s * 10, per_seq_s=fast.per_seq_s * 10,
                   per_prefill_token_s=fast.per_prefill_token_s * 10, noise=0.0, flush_every=0)
    return _cost(fast), _cost(slow)


def _simulated_arrivals(requests: list[Request], cost: CostModel) -> tuple[dict, dict]:
    workload = workload_from_requests(requests, Config(**SETTINGS), "conversations")
    result = run_variant(workload, {}, cost)
    assert result.ok and result.events is not None
    tables = result.events.tables
    finished = dict(zip(np.asarray(tables["request_finished"]["seq_id"]).tolist(),
                        np.asarray(tables["request_finished"]["step"]).tolist()))
    steps = dict(zip(np.asarray(tables["model_step"]["step"]).tolist(),
                     np.asarray(tables["model_step"]["wall_time_s"]).tolist()))
    arrivals = dict(zip(np.asarray(tables["request_added"]["seq_id"]).tolist(),
                        np.asarray(tables["request_added"]["arrival_s"]).tolist()))
    ends = {s: steps[step] for s, step in finished.items()}
    return arrivals, ends


def test_a_slower_engine_delays_later_turns(fast_and_slow) -> None:
    requests = conversations(num=1, turns=4, think="fixed:0.5")  # one chain: ids follow turns
    fast_arrivals, fast_ends = _simulated_arrivals(requests, fast_and_slow[0])
    slow_arrivals, slow_ends = _simulated_arrivals(requests, fast_and_slow[1])
    assert fast_arrivals[0] == slow_arrivals[0] == 0.0  # the first turn arrives as stated
    for turn in range(1, 4):
        # Each turn is due exactly its think time after the previous turn's last step ended.
        assert fast_arrivals[turn] == pytest.approx(fast_ends[turn - 1] + 0.5)
        assert slow_arrivals[turn] == pytest.approx(slow_ends[turn - 1] + 0.5)
        assert slow_arrivals[turn] > fast_arrivals[turn]
    assert slow_arrivals[3] - fast_arrivals[3] > 3 * (slow_arrivals[1] - fast_arrivals[1]) / 2
