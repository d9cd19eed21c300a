"""The simulated executor's decode-stretch calls give what its per-step calls give.

What these tests prove: ``decode_tokens`` gives each sequence the tokens ``execute`` would
sample for it step by step (recorded ones first, then synthetic, never EOS) and
``count_sampled`` counts the synthetic ones as ``execute`` does; ``price_decode`` moves the
clock and answers as ``execute`` of the same decode batch.
"""

from __future__ import annotations

import numpy as np

from engine.batch import ScheduledBatch
from engine.config import Config
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from replay.whatif.cost.model import CostModel
from replay.whatif.sim_executor import SimClock, SimExecutor
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload


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
