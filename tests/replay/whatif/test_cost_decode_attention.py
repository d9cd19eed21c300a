"""A decode's attention priced from what it reads: the KV tokens read from memory (a block
shared by several rows read once) and the longest attention program (the kernel's last wave)."""

from __future__ import annotations

import numpy as np

from engine.attention_splits import choose_num_splits
from engine.batch import ScheduledBatch
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from replay.recorded import RecordedEvents
from replay.whatif.cost.decode_attention import decode_features, longest_contexts
from replay.whatif.cost.features import (
    FEATURES,
    KV,
    LONGEST,
    StepFeatures,
    calibration_features,
)
from replay.whatif.cost.fit import select
from replay.whatif.cost.model import StepTime
from replay.whatif.sim_executor import SimClock, SimExecutor


def test_a_block_shared_by_several_rows_is_read_once() -> None:
    # Two rows share their first two 16-token blocks (a common prefix); the third shares none.
    tables = [[0, 1, 2], [0, 1, 3], [4, 5]]
    contexts = [40, 44, 30]
    kv, longest = decode_features(contexts, tables, 16, 4, 8)
    assert kv == sum(contexts) - 2 * 16
    assert longest == 44 / choose_num_splits(4, 8)
    unshared, _ = decode_features(contexts, tables, 0, 4, 8)  # block size 0: sharing not counted
    assert unshared == sum(contexts)
    assert decode_features([], [], 16, 1, 8) == (0.0, 0.0)


def test_a_recorded_step_s_longest_contexts_come_from_its_scheduled_rows() -> None:
    steps = np.array([0, 1, 2])
    tables = {
        "model_step": {"step": steps},
        # Step 0 a prefill (8 new tokens), step 1 two decodes, step 2 a prefill and a decode;
        # step 3's row has no model step (a recording cut short): ignored.
        "seq_scheduled": {"step": np.array([0, 1, 1, 2, 2, 3]),
                          "num_new_tokens": np.array([8, 1, 1, 5, 1, 1]),
                          "context_len": np.array([8, 9, 30, 5, 12, 99])},
    }
    events = RecordedEvents({}, tables, 2)
    assert longest_contexts(events).tolist() == [0.0, 30.0, 12.0]
    assert longest_contexts(events, decode=False).tolist() == [8.0, 0.0, 5.0]


def test_a_calibration_row_s_longest_context_is_its_max_else_its_mean() -> None:
    base = {"num_seqs": 4, "prefill_tokens": 0, "prefill_attn_work": 0, "decode_seqs": 4,
            "decode_context_tokens": 4000, "padded_batch_size": 4}
    x = calibration_features([base, {**base, "decode_context_max": 2500}], kv_heads=8)
    splits = choose_num_splits(4, 8)
    assert x[:, FEATURES.index(LONGEST)].tolist() == [1000 / splits, 2500 / splits]
    assert x[:, FEATURES.index(KV)].tolist() == [4000, 4000]


def test_the_longest_program_term_is_chosen_where_the_law_has_it() -> None:
    """Batches of spread contexts: a law with a last-wave term is recovered by the feature set
    that has it, and held-out steps say so."""
    rng = np.random.default_rng(0)
    n = 400
    seqs = rng.integers(1, 257, n).astype(float)
    mean = rng.uniform(200, 4000, n)
    longest_ctx = mean * rng.uniform(1.0, 3.0, n)
    x = np.zeros((n, len(FEATURES)))
    for name in ("num_seqs", "decode_seqs", "padded_batch_size"):
        x[:, FEATURES.index(name)] = seqs
    x[:, FEATURES.index("decode_context_tokens")] = x[:, FEATURES.index(KV)] = seqs * mean
    x[:, FEATURES.index(LONGEST)] = longest_ctx / np.array(
        [choose_num_splits(int(s), 8) for s in seqs])
    y = (1.3e-3 + 1.5e-6 * seqs + 2.4e-8 * seqs * mean + 3e-7 * x[:, FEATURES.index(LONGEST)])
    fit, report = select("decode_graph", x, y * np.exp(rng.normal(0, 0.01, n)))
    assert fit is not None and LONGEST in fit.features, report
    assert abs(fit.coef[FEATURES.index(LONGEST)] / 3e-7 - 1) < 0.1


class _RecordingCost:
    """A stand-in step-time model that keeps the features the simulator prices a step by."""

    graph_sizes: list[int] = []
    prefill_graph_sizes: list[int] = []
    prefill_graph_max_seqs = 0
    kv_heads = 8
    source, mode = "test", "overlap"

    def __init__(self, shared_kv: bool) -> None:
        self.shared_kv = shared_kv
        self.seen: list[StepFeatures] = []

    def predict(self, step, cls_name, overlapped=False, first=False) -> StepTime:
        self.seen.append(step)
        return StepTime(1e-3, 1e-4, 1e-3)


def _decode_step(shared_kv: bool) -> StepFeatures:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    # Two decodes sharing their first two 16-token blocks (a common prefix).
    seqs = [Sequence(i, [1] * ctx, params) for i, ctx in enumerate((40, 44))]
    seqs[0].block_table, seqs[1].block_table = [0, 1, 2], [0, 1, 3]
    cost = _RecordingCost(shared_kv)
    executor = SimExecutor(100, SimClock(), cost, block_size=16)
    executor.execute(ScheduledBatch(0, "decode", seqs, [1, 1], [40, 44], 0, sampled_seqs=seqs))
    return cost.seen[0]


def test_the_simulator_counts_shared_blocks_once_only_where_the_model_says_so() -> None:
    shared, unshared = _decode_step(True), _decode_step(False)
    assert unshared.decode_kv_tokens == unshared.decode_context_tokens == 84
    assert shared.decode_kv_tokens == 84 - 2 * 16
    assert shared.decode_longest_tokens == unshared.decode_longest_tokens == 44 / choose_num_splits(
        2, 8)


def test_shared_blocks_and_kv_heads_reach_the_model() -> None:
    from engine.config import Config
    from replay.whatif.cost.model import CostModel
    from replay.whatif.cost.options import CostOptions
    from replay.whatif.synthetic import StepLaw, record_workload
    from replay.workloads.request import Request

    rng = np.random.default_rng(0)
    requests = [Request(rng.integers(0, 9000, size=int(rng.integers(20, 600))).tolist(),
                        int(rng.integers(20, 120)), arrival_s=0.03 * i) for i in range(60)]
    trace = record_workload(Config(num_kvcache_blocks=600), requests, StepLaw(noise=0.0))
    off = CostModel.fit(trace, options=CostOptions(shared_kv=True))
    assert off.shared_kv and not CostModel.fit(trace).shared_kv
    assert "model" not in trace.header and off.kv_heads == 1  # a header naming no model
    trace.header["model"] = {"num_kv_heads": 8}
    assert CostModel.fit(trace).kv_heads == 8


def test_a_recording_says_which_blocks_its_decode_rows_shared(monkeypatch) -> None:
    """``recorded_rereads`` from a recording's block events equals, step by step, what the
    engine's own block tables held (system prompts shared through the prefix cache, a pool
    small enough to preempt), and ``feature_matrix(shared_blocks=True)`` reads it as KV read
    once."""
    import random

    from engine.config import Config
    from replay.whatif import synthetic
    from replay.whatif.cost.decode_attention import recorded_rereads
    from replay.whatif.cost.features import feature_matrix
    from replay.workloads.request import Request

    truth: dict[int, float] = {}
    execute = synthetic.LawExecutor.execute

    def spy(self, batch):  # the engine's tables at the step
        rows = [(seq, ctx) for seq, new, ctx in zip(batch.seqs, batch.num_new_tokens,
                                                     batch.context_lens) if new == 1]
        if rows:
            contexts = [ctx for _, ctx in rows]
            kv, _ = decode_features(contexts, [list(s.block_table) for s, _ in rows], 16, 1, 1)
            truth[batch.step] = sum(contexts) - kv
        return execute(self, batch)

    monkeypatch.setattr(synthetic.LawExecutor, "execute", spy)
    rng = random.Random(0)
    prefixes = [[rng.randint(10, 1000) for _ in range(64)] for _ in range(3)]
    requests = [Request(prefixes[i % 3] + [rng.randint(10, 1000)
                                           for _ in range(rng.randint(5, 40))],
                        rng.randint(20, 60)) for i in range(40)]
    config = Config(kvcache_block_size=16, num_kvcache_blocks=40, max_num_seqs=16,
                    max_model_len=512)
    events = synthetic.record_workload(config, requests, synthetic.StepLaw(noise=0.0))
    assert len(events.tables["preempted"]["step"]) > 0
    steps = np.asarray(events.tables["model_step"]["step"]).tolist()
    found = dict(zip(steps, recorded_rereads(events, 16).tolist()))
    assert sum(v > 0 for v in truth.values()) > 50
    assert {step: found[step] for step in truth} == truth
    x, _ = feature_matrix(events, shared_blocks=True)
    plain, _ = feature_matrix(events)
    at_kv, at_context = FEATURES.index(KV), FEATURES.index("decode_context_tokens")
    assert np.array_equal(x[:, at_context] - x[:, at_kv], recorded_rereads(events, 16))
    assert np.array_equal(plain[:, at_kv], plain[:, at_context])
