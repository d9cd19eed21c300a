"""The invariant checker's ``preemption`` check that a preemption was needed: the sequence it
made room for had a next token starting a new block, and no block was free. Without it a
scheduler preempting for a decode that fits its last block (``decode_room_off_by_one`` in
``tools/mutation_check.py``) passed every check: the victim is recomputed, so every request
still finishes with its tokens."""

from __future__ import annotations

import copy

import pytest

from engine.config import Config
from engine.scheduler import Scheduler
from replay.testing import RequestSpec, Workload, check_events, run_workload


def _last_slot_run() -> tuple[dict, dict]:
    """Seq 0's first decode starts a block with none free and preempts seq 2 (the newest); seq
    1's first decode fills its last block's last slot in the same step and needs no block."""
    config = Config(kvcache_block_size=2, num_kvcache_blocks=4, max_model_len=16,
                    max_num_batched_tokens=16, max_num_seqs=4)
    requests = tuple(RequestSpec(0, p, 3, True, (2, 3, 4)) for p in ((1, 2), (2, 3, 4), (3, 4)))
    run = run_workload(Workload(config, requests))
    run.raise_violations()
    tables = run.sink.tables
    assert tables["preempted"]["seq_id"][0] == 2 and tables["preempted"]["for_seq_id"][0] == 0
    return run.sink.header, tables


def test_a_needed_preemption_passes_and_one_for_a_decode_that_fits_is_caught() -> None:
    """The recorded preemption passes; the same event claiming to make room for seq 1 (whose
    token fits its blocks) is a ``preemption`` violation naming both sequences."""
    header, tables = _last_slot_run()
    assert check_events(header, tables).ok
    bad = copy.deepcopy(tables)
    bad["preempted"]["for_seq_id"][0] = 1
    report = check_events(header, bad)
    assert report.names() == ["preemption"], report.report()
    assert "preempted for seq 1 (4 tokens in 2 blocks of 2) with 0 blocks free" in report.report()


def test_a_preemption_while_blocks_are_free_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler that preempts the newest running sequence before every block claim, free
    blocks or not (the bulk decode path switched off, so every claim goes through the loop),
    fails ``preemption``: blocks were free."""
    claim = Scheduler._claim_decode_slot

    def eager(self: Scheduler, seq, step) -> bool:  # type: ignore[no-untyped-def]
        if seq.num_tokens > len(seq.block_table) * self.block_size and self.running:
            self._preempt(self.running.pop(), for_seq=seq)
        return claim(self, seq, step)

    monkeypatch.setattr(Scheduler, "_decode_all", lambda self, step, batch: False)
    monkeypatch.setattr(Scheduler, "_claim_decode_slot", eager)
    config = Config(kvcache_block_size=2, num_kvcache_blocks=16, max_model_len=16,
                    max_num_batched_tokens=16, max_num_seqs=4)
    requests = tuple(RequestSpec(0, (i, 5), 3, True, (2, 3, 4)) for i in range(2))
    run = run_workload(Workload(config, requests))
    found = [str(v) for v in run.violations.get("preemption", [])]
    assert found and "with 0 blocks free" not in found[0], run.violations
