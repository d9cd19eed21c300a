"""Session 32 (what-if and tune): defects in ``replay.whatif`` found probing ``whatif`` and
``tune``.

What these tests prove: ``tune``'s ``best`` and ``closest`` choose among the same runs, the
searched ones and the source's own (with ``--budget 1`` the one survivor could miss the SLOs by
more than the as-recorded run, which ``closest`` never named, and an as-recorded run meeting
them was never ``best``); the SLOs refuse a metric bounded twice; a recorded user policy that
cannot be imported is kept by name when every variant sets a policy, a variant keeping it being
``cannot run``; and every synthetic token comes from one rule (``synthetic_ids``), EOS included.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import Config
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from replay.whatif import tune_report
from replay.whatif.sim_executor import (
    SYNTHETIC_BASE,
    SYNTHETIC_RANGE,
    SYNTHETIC_STRIDE,
    SimClock,
    SimExecutor,
    synthetic_ids,
)
from replay.whatif.simulate import OK, SimResult, SimWorkload, run_variant
from replay.whatif.tune import Slo, TuneError, check_slos, parse_slos, tune

SLO = Slo("ttft_p99", 0.5)


def _stub(ttft_of: dict[int, float]):
    """256 requests; a run's TTFT p99 by its max_num_seqs (the source's: 512)."""
    workload = SimWorkload("stub", Config(num_kvcache_blocks=100, max_num_seqs=512), {},
                           requests=[object()] * 256)  # type: ignore[list-item]

    def run(w, variants):
        return [SimResult(n, o, OK, True, {
            "requests": float(len(w.requests)), "rejected": 0.0, "makespan_s": 10.0,
            "ttft_p99_s": ttft_of[o.get("max_num_seqs", 512)]}) for n, o in variants]

    return workload, run


def test_closest_weighs_the_as_recorded_run_as_best_does():
    # --budget 1 keeps one of 64 and 128 for the whole workload; the source's 512 misses least.
    workload, run = _stub({64: 3.0, 128: 2.0, 512: 0.6})
    result = tune(workload, [SLO], {"max_num_seqs": [64, 128]}, run, budget=1)
    assert [e.name for e in result.evaluations] == ["max_num_seqs=128"]
    assert result.best is None and result.closest is result.baseline
    (line,) = tune_report.verdict(result)
    assert line == "closest: as recorded misses ttft_p99 600.00 ms > 500 ms"  # was =128's 2000


def test_an_as_recorded_run_meeting_the_slos_is_the_best_when_no_searched_one_does():
    workload, run = _stub({64: 3.0, 128: 2.0, 512: 0.4})
    result = tune(workload, [SLO], {"max_num_seqs": [64, 128]}, run, budget=1)
    assert result.best is result.baseline and result.closest is None  # was: best None
    assert result.set_lines() == []  # the source's own settings
    # A searched run equal to the source's own stands for it (a row of the printed front).
    workload, run = _stub({64: 3.0, 512: 0.4})
    result = tune(workload, [SLO], {"max_num_seqs": [64, 512]}, run)
    assert result.best is not None and result.best.overrides == {"max_num_seqs": 512}


def test_an_slo_metric_given_twice_is_refused():
    with pytest.raises(TuneError, match="--slo ttft_p99 is given twice"):
        parse_slos(["ttft_p99=1", "tpot_p50=0.1", "ttft_p99=2"])
    with pytest.raises(TuneError, match="--slo tpot_p50 is given twice"):
        check_slos([Slo("tpot_p50", 1.0), Slo("tpot_p50", 1.0)])
    workload, run = _stub({512: 0.1})
    with pytest.raises(TuneError, match="given twice"):  # tune() itself, for API callers
        tune(workload, [SLO, Slo("ttft_p99", 2.0)], {"max_num_seqs": [512]}, run)
    assert parse_slos(["ttft_p99=1", "ttft_p50=1"]) == (Slo("ttft_p99", 1.0),
                                                        Slo("ttft_p50", 1.0))


def test_a_missing_user_policy_is_kept_by_name_when_every_variant_sets_one():
    from replay.recorded import from_trace
    from replay.whatif.source import load_source
    from tracing.reader import read_trace

    events = from_trace(read_trace("traces/cpu-tiny-demo"))
    events.header["config"] = {**events.header["config"], "policy": "nomodule32.x:Policy"}
    workload = load_source(events, policy_needed=False)
    assert workload.config.to_dict()["policy"] == "nomodule32.x:Policy"  # the recorded config
    chunked = run_variant(workload, {"policy": "chunked"}, None)
    kept = run_variant(workload, {"max_num_seqs": 2}, None)
    assert chunked.ok and chunked.metrics["requests"] == len(workload.requests)
    assert kept.status.startswith("cannot run: policy 'nomodule32.x:Policy': cannot import")


@pytest.mark.parametrize("eos", [-1, 5, SYNTHETIC_BASE, SYNTHETIC_BASE + 7919,
                                 SYNTHETIC_BASE + SYNTHETIC_RANGE - 1])
def test_every_synthetic_token_comes_from_one_rule(eos):
    ids = synthetic_ids(eos)
    assert len(ids) == SYNTHETIC_RANGE and eos not in ids.tolist()  # EOS is never sampled
    executor = SimExecutor(100, SimClock(), eos=eos)
    for seq_id in range(3):
        executor.bind(seq_id, None)
    walk = [(s * SYNTHETIC_STRIDE + c) % SYNTHETIC_RANGE for s in range(3) for c in range(40)]
    expected = ids[walk].reshape(3, 40)
    assert (executor.decode_tokens(np.arange(3), np.zeros(3, np.int64), 40) == expected).all()
    for seq_id in range(3):
        assert list(executor.sequence_tokens(seq_id, 0, 40)) == expected[seq_id].tolist()
        assert [executor._synthetic(seq_id, c) for c in range(40)] == expected[seq_id].tolist()
    seqs = [Sequence(i, [1, 2], SamplingParams(max_tokens=50)) for i in range(3)]
    assert executor._sample(seqs) == expected[:, 0].tolist()
