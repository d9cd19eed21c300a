"""The simulated executor's decode-stretch calls give what its per-step calls give.

What these tests prove: ``decode_tokens`` gives each sequence the tokens ``execute`` would
sample for it step by step (recorded ones first, then synthetic, never EOS), and
``sequence_tokens`` gives one sequence's row of them (across the synthetic range's wrap, an EOS
inside it, recorded tokens partly used); ``count_sampled`` counts the synthetic ones as
``execute`` does; ``price_decode`` moves the
clock and answers as ``execute`` of the same decode batch.
"""

from __future__ import annotations

import numpy as np

from engine.batch import ScheduledBatch
from engine.config import Config
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from replay.recorded import from_trace
from replay.whatif.cost.model import CostModel
from replay.whatif.sim_executor import SimClock, SimExecutor
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from tracing.reader import read_trace

H200_TRACE = "traces/h200-reference-s4"


def _batch(seqs: list[Sequence]) -> ScheduledBatch:
    return ScheduledBatch(step=0, kind="decode", seqs=seqs, num_new_tokens=[1] * len(seqs),
                          context_lens=[s.num_tokens for s in seqs], num_prefill_seqs=0,
                          num_batched_tokens=len(seqs), sampled_seqs=seqs)


def _executors(recorded: bool, eos: int) -> tuple[SimExecutor, SimExecutor, list[Sequence]]:
    pair = []
    for _ in range(2):
        executor = SimExecutor(100, SimClock(), eos=eos)
        for seq_id in range(3):
            executor.bind(seq_id, [eos, 2, 3] if recorded and seq_id != 1 else None)
        pair.append(executor)
    seqs = [Sequence(i, [1] * (4 + i), SamplingParams(max_tokens=20)) for i in range(3)]
    for seq in seqs:
        seq.extend_tokens([9] * seq.seq_id)  # 0, 1 and 2 tokens sampled so far
    return pair[0], pair[1], seqs


def test_decode_tokens_are_the_tokens_sampled_step_by_step() -> None:
    for recorded in (False, True):
        for eos in (-1, 7919 % 10000, 2):
            stepped, bulk, seqs = _executors(recorded, eos)
            ids = np.array([s.seq_id for s in seqs])
            completions = np.array([s.num_completion_tokens for s in seqs])
            tokens = bulk.decode_tokens(ids, completions, 5)
            bulk.count_sampled(ids, completions, np.array([5, 3, 5]))
            columns = []
            for step in range(5):
                running = [s for i, s in enumerate(seqs) if step < (5, 3, 5)[i]]
                out = stepped.execute(_batch(running)).token_ids
                columns.append(dict(zip([s.seq_id for s in running], out)))
                for seq, token in zip(running, out):
                    seq.append_token(token)
            for row, seq_id in enumerate(ids.tolist()):
                mine = [c[seq_id] for c in columns if seq_id in c]
                assert tokens[row, :len(mine)].tolist() == mine, (recorded, eos, seq_id)
            assert bulk.synthesized == stepped.synthesized, (recorded, eos)
            summed, _, _ = _executors(recorded, eos)  # given the sum of ``sampled``
            summed.count_sampled(ids, completions, np.array([5, 3, 5]), 13)
            assert summed.synthesized == stepped.synthesized, (recorded, eos)


def test_sequence_tokens_are_one_row_of_decode_tokens() -> None:
    for eos in (-1, 7919 % 10000, 3, 9999):
        executor = SimExecutor(100, SimClock(), eos=eos)
        for seq_id in range(6):
            executor.bind(seq_id, [eos, 2, 3, 4] if seq_id == 4 else None)
        for seq_id, completion, count in ((0, 0, 300), (1, 2070, 40), (1, 2081, 12_000),
                                          (2, 0, 1), (4, 2, 9), (4, 4, 5), (5, 9990, 20)):
            row = executor.decode_tokens(np.array([seq_id]), np.array([completion]), count)
            assert list(executor.sequence_tokens(seq_id, completion, count)) == row[0].tolist(), \
                (eos, seq_id, completion, count)
        assert executor.synthesized == 0  # counts nothing


def test_price_decode_answers_as_execute() -> None:
    cost = CostModel.fit(record_workload(Config(num_kvcache_blocks=400, max_num_seqs=64),
                                         reference_workload(num_seqs=16), StepLaw(), seed=1))
    seqs = [Sequence(i, [1] * (30 + 7 * i), SamplingParams(max_tokens=20)) for i in range(6)]
    for overlapped in (False, True):
        stepped = SimExecutor(100, SimClock(), cost, use_graphs=True)
        bulk = SimExecutor(100, SimClock(), cost, use_graphs=True)
        batch = _batch(seqs)
        batch.overlapped = overlapped
        want = stepped.execute(batch)
        got = bulk.price_decode(len(seqs), sum(batch.context_lens), overlapped,
                                max(batch.context_lens))
        assert got.token_ids == [] and want.token_ids
        got.token_ids = want.token_ids
        assert got == want and bulk.clock.now == stepped.clock.now > 0
        assert (bulk.steps, bulk.overlapped_steps, bulk.last_interval_s) == \
            (stepped.steps, stepped.overlapped_steps, stepped.last_interval_s)


def test_price_decodes_answers_as_price_decode_step_by_step() -> None:
    # The H200 reference trace's model: overlap mode (host time, offsets by launch mode), CUDA
    # graphs up to 512 rows.
    cost = CostModel.fit(from_trace(read_trace(H200_TRACE)), source=H200_TRACE)
    assert cost.mode == "overlap" and max(cost.graph_sizes) < 600
    # Batch sizes beyond the largest graph (eager steps) and across graph sizes, shrinking as
    # sequences finish; contexts growing by a token per sequence and step.
    num_seqs = [600, 600, 70, 69, 40, 33, 9, 2, 1]
    contexts = [n * (500 + step) for step, n in enumerate(num_seqs)]
    longest = [900 + step for step in range(len(num_seqs))]
    for graphs in (False, True):
        for overlapped, defer in ((False, True), (True, True), (True, False)):
            stepped, bulk, probe = (SimExecutor(100, SimClock(), cost, use_graphs=graphs)
                                    for _ in range(3))
            for executor in (stepped, bulk, probe):  # a warm start: every class has run once
                for n in (1, 70, 600):
                    executor.price_decode(n, 500 * n, False, 500)
            start = stepped.clock.now
            starts = []  # when each step starts, priced without a stop
            for step, (n, context, long) in enumerate(zip(num_seqs, contexts, longest)):
                starts.append(probe.clock.now)
                probe.price_decode(n, context, defer if step else overlapped, long)
            until = starts[5]  # the sixth step would start then: five are priced
            per_step = [stepped.price_decode(num_seqs[0], contexts[0], overlapped, longest[0])]
            for n, context, long in zip(num_seqs[1:], contexts[1:], longest[1:]):
                if stepped.clock.now >= until:
                    break
                per_step.append(stepped.price_decode(n, context, defer, long))
            priced = bulk.price_decodes(num_seqs, contexts, longest, overlapped, defer, until)
            assert priced is not None and len(priced.began) == len(per_step) == 5
            assert priced.began == starts[:5]
            assert priced.duration_s == [out.duration_s for out in per_step]
            assert priced.wait_s == [out.wait_s for out in per_step]
            assert priced.padded == [out.padded_batch_size for out in per_step]
            assert priced.graph_used == [out.graph_used for out in per_step]
            assert priced.began[0] == start and priced.ended[-1] == stepped.clock.now
            assert priced.last == per_step[-1]
            assert (bulk.clock.now, bulk.steps, bulk.overlapped_steps, bulk.last_interval_s) \
                == (stepped.clock.now, stepped.steps, stepped.overlapped_steps,
                    stepped.last_interval_s)


def test_price_decodes_leaves_a_first_step_of_its_class_to_price_decode() -> None:
    cost = CostModel.fit(record_workload(Config(num_kvcache_blocks=400, max_num_seqs=64),
                                         reference_workload(num_seqs=16), StepLaw(), seed=1))
    cold = SimExecutor(100, SimClock(), cost, use_graphs=True)
    assert cold.price_decodes([4, 4], [40, 44], [10, 11], False, True, 1.0) is None
    assert cold.steps == 0 and cold.clock.now == 0.0
    assert SimExecutor(100, SimClock()).price_decodes([4], [40], [10], False, True, 1.0) is None
    assert cold.price_decodes([], [], [], False, True, 1.0) is None
