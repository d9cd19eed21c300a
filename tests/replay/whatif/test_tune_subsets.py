"""``tune``'s evaluations: successive halving on a workload file (``--workload FILE``, no
recording) runs subsets of the file's first requests; an aborted request is not served."""

from __future__ import annotations

from engine.config import Config
from replay.whatif.simulate import run_variant, workload_from_requests
from replay.whatif.tune import MIN_SUBSET, Slo, subset, tune
from replay.workloads.request import Request


def _workload(n: int):
    requests = [Request([5 + i % 50] * (8 + i % 5), 3, arrival_s=0.01 * i) for i in range(n)]
    return workload_from_requests(requests, Config(num_kvcache_blocks=64), name="w")


def test_a_subset_of_a_workload_file_runs_its_first_requests_only() -> None:
    """``subset`` cut ``requests`` but not the file's own ``workload`` list that the simulation
    feeds (indexing ``requests`` by position): a subset run raised IndexError (``replayllm
    tune --workload FILE`` of 96 requests or more: a traceback). It now runs the first ``n``."""
    whole = _workload(3 * MIN_SUBSET)
    part = subset(whole, MIN_SUBSET)
    assert part.workload is not None and len(part.workload) == len(part.requests) == MIN_SUBSET
    result = run_variant(part, {}, None, "part")
    assert result.ok, result.status
    assert result.metrics["requests"] == MIN_SUBSET


def test_tune_narrows_a_workload_file_on_subsets() -> None:
    whole = _workload(3 * MIN_SUBSET)
    seen: list[int] = []

    def run(workload, variants):
        seen.append(len(workload.requests))
        return [run_variant(workload, o, None, n) for n, o in variants]

    result = tune(whole, [Slo("ttft_p99", 1.0)], {"max_num_seqs": [1, 2, 4, 8]}, run, budget=1)
    assert seen[:2] == [MIN_SUBSET, 3 * MIN_SUBSET]
    assert all(e.result.ok for e in result.evaluations)


def test_an_aborted_request_is_not_served() -> None:
    """A replayed abort ends a request still running at its recorded time, so a slower
    configuration loses more requests and, ending early, gets a shorter makespan: counted as
    served (``requests - rejected``), those raised its goodput above a faster configuration's
    that finished them. Requests and goodput now leave aborted requests out."""
    import pandas as pd

    from replay.whatif.simulate import OK, SimResult
    from replay.whatif.tune import Evaluation

    slo = (Slo("ttft_p99", 1.0),)

    def evaluation(reasons: list[str], makespan: float) -> Evaluation:
        metrics = {"requests": float(len(reasons)), "rejected": 0.0, "makespan_s": makespan,
                   "ttft_p99_s": 0.5}
        frame = pd.DataFrame({"finish_reason": reasons})
        return Evaluation({}, SimResult("x", {}, OK, True, metrics, frame), len(reasons), slo)

    fast = evaluation(["length"] * 10, makespan=10.0)
    slow = evaluation(["length"] * 5 + ["aborted"] * 5, makespan=8.0)
    assert fast.goodput_req_s == 1.0
    assert slow.aborted == 5 and slow.goodput_req_s == 5 / 8.0
    assert fast.rank_key() > slow.rank_key()
