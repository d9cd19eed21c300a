"""A workload file's request that a variant can never serve is rejected as the live engine
rejects it, not the whole variant (``run_variant``, ``simulate_stream`` and ``tune``).

What these tests prove:
- a prompt longer than ``max_model_len`` (or needing more KV blocks than the pool) is rejected
  by the simulated engine with the engine's own reason, counted in the summary's ``rejected``
  and named in a note; the other requests are predicted (the variant was ``cannot run``);
- the simulation's decisions are those of an engine fed the same requests (the rejection
  included), and streamed equals whole;
- a conversation whose later turn grows past ``max_model_len`` has that turn rejected, and a
  turn after it is never sent, as ``WorkloadInputs`` does in a live run;
- a variant rejecting every request is still ``cannot run`` with the count;
- ``tune`` never counts a configuration rejecting requests as meeting the SLOs (it would meet
  them by leaving the hardest requests out), nor puts it on the Pareto front.
"""

from __future__ import annotations

import pytest

from engine.config import Config
from replay.verify import compare_decisions
from replay.whatif.cost.model import CostModel
from replay.whatif.executors import variant_runner
from replay.whatif.simulate import run_variant, workload_from_requests
from replay.whatif.stream import WorkloadSource, simulate_stream
from replay.whatif.synthetic import StepLaw, record_workload
from replay.whatif.tune import parse_slos, tune
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request

CONFIG = Config(num_kvcache_blocks=64, kvcache_block_size=16, max_model_len=128,
                max_num_batched_tokens=256, max_num_seqs=8)


@pytest.fixture(scope="module")
def cost() -> CostModel:
    timing = Config(num_kvcache_blocks=400, max_num_seqs=64)
    return CostModel.fit(record_workload(timing, reference_workload(num_seqs=24), StepLaw(),
                                         seed=1))


def requests(arrivals: bool = False) -> list[Request]:
    """Six requests of distinct prompts; request 2's prompt is past max_model_len=128."""
    out = []
    for i in range(6):
        length = 300 if i == 2 else 20 + 7 * i
        prompt = [(1000 * i + j) % 30000 + 5 for j in range(length)]
        out.append(Request(prompt, max_tokens=6, temperature=0.0,
                           arrival_s=0.01 * i if arrivals else 0.0))
    return out


def test_a_request_past_max_model_len_is_rejected_not_the_variant() -> None:
    """Untimed: status ok, one request rejected with the engine's reason, the other five
    served whole; the decisions equal an engine's fed the same six requests."""
    result = run_variant(workload_from_requests(requests(), CONFIG, "w"), {}, None)
    assert result.ok, result.status
    assert result.metrics["requests"] == 6 and result.metrics["rejected"] == 1
    assert result.metrics["completion_tokens"] == 5 * 6
    assert result.newly_rejected == 1
    (note,) = [n for n in result.notes if "rejected by this configuration" in n]
    assert note.startswith("1 of 6 requests rejected") and \
        "request 2: prompt has 300 tokens, more than max_model_len=128" in note
    recorded = record_workload(CONFIG, requests(), law=None)
    assert result.events is not None
    assert compare_decisions(recorded, result.events) is None


def test_a_pool_too_small_for_one_request_rejects_it_timed_and_streamed(cost: CostModel
                                                                        ) -> None:
    """Timed, with a pool of 4 blocks x 16 tokens: only the request needing more is rejected
    (by the KV rule), and the streamed run gives the same metrics, notes and count."""
    reqs = requests(arrivals=True)
    reqs[2] = Request(reqs[2].prompt[:100], max_tokens=6, temperature=0.0, arrival_s=0.02)
    small = {"num_kvcache_blocks": 4}  # 64 tokens: request 2 (105 to hold) never fits
    whole = run_variant(workload_from_requests(reqs, CONFIG, "w"), small, cost)
    streamed = simulate_stream(WorkloadSource(reqs, CONFIG, "w"), small, cost)
    for result in (whole, streamed):
        assert result.ok, result.status
        assert result.metrics["rejected"] == 1 and result.newly_rejected == 1
        assert any("request 2: request needs 7 KV blocks" in n for n in result.notes)
    for name, value in whole.metrics.items():
        assert repr(streamed.metrics[name]) == repr(value), name


def test_a_later_turn_past_max_model_len_is_rejected_and_its_next_turn_skipped() -> None:
    """Turn 1 of a conversation (turn 0's prompt and answer plus its own tokens) is past
    max_model_len: it is rejected, its turn 2 never sent; the other conversation is served."""
    def turn(conversation: str, number: int, length: int, base: int) -> Request:
        return Request(list(range(base, base + length)), max_tokens=4, temperature=0.0,
                       conversation_id=conversation, turn=number)

    reqs = [turn("a", 0, 60, 100), turn("b", 0, 10, 5000), turn("a", 1, 70, 200),
            turn("b", 1, 10, 6000), turn("a", 2, 5, 300)]
    result = run_variant(workload_from_requests(reqs, CONFIG, "w"), {}, None)
    assert result.ok, result.status
    assert result.metrics["rejected"] == 1 and result.newly_rejected == 1
    assert result.metrics["requests"] == 4  # a's turn 2 was never sent
    assert any("request 2: prompt has 134 tokens" in n for n in result.notes)


def test_a_variant_rejecting_every_request_cannot_run() -> None:
    result = run_variant(workload_from_requests(requests(), CONFIG, "w"),
                         {"max_model_len": 16, "max_num_batched_tokens": 16}, None)
    assert result.status.startswith("cannot run: 6 of 6 requests can never be scheduled "
                                    "(request 0: prompt has 20 tokens"), result.status


def test_tune_never_picks_a_configuration_that_rejects_requests(cost: CostModel) -> None:
    """max_model_len=64 rejects request 2 (100 tokens) and meets the TTFT SLO on the five
    left: it is marked as not meeting, off the Pareto front; the best serves all six."""
    reqs = requests(arrivals=True)
    reqs[2] = Request(reqs[2].prompt[:100], max_tokens=6, temperature=0.0, arrival_s=0.02)
    workload = workload_from_requests(reqs, CONFIG, "w")
    result = tune(workload, list(parse_slos(["ttft_p99=10"])),
                  {"max_model_len": [64, 128], "max_num_batched_tokens": [256]},
                  variant_runner("process", cost, jobs=1))
    by_name = {e.overrides["max_model_len"]: e for e in result.evaluations}
    assert by_name[64].result.ok and by_name[64].result.newly_rejected == 1
    assert not by_name[64].meets and by_name[64].goodput_req_s == 0.0
    assert by_name[128].meets
    assert result.best is not None and result.best.result.newly_rejected == 0
    assert all(e.result.newly_rejected == 0 for e in result.pareto_front())
