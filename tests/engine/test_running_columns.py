"""The running sequences' columns kept between decode stretches are those gathered afresh.

What these tests prove: after ``keep`` (a stretch's survivors, a token count later) and
``refresh`` with sequences admitted after them, every column equals a fresh gather of the same
sequences; a sequence that moved outside a stretch (its token count changed), one removed from
the middle or the order changed make ``refresh`` gather every row again; the EOS watch follows
the rows kept (a watcher finishing clears it, one admitted sets it); rows kept ``lagging``
(their sequences not given the stretch's tokens) are synced to exactly the sequences that took
them, by ``sync`` or by a ``refresh`` that must gather again, and a lagging refresh of the same
sequences gathers nothing.
"""

from __future__ import annotations

import numpy as np

from engine.running_columns import RunningColumns
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

MAX_MODEL_LEN = 300


def _seq(seq_id: int, prompt: int, max_tokens: int, ignore_eos: bool = True) -> Sequence:
    seq = Sequence(seq_id, list(range(prompt)),
                   SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))
    seq.block_table = list(range(seq_id, seq_id + 1 + prompt // 16))
    seq.extend_tokens([7])  # it has sampled once: decoding
    return seq


def _fresh(seqs: list[Sequence]) -> RunningColumns:
    columns = RunningColumns()
    columns.refresh(seqs, MAX_MODEL_LEN)
    return columns


def _same(kept: RunningColumns, seqs: list[Sequence]) -> None:
    fresh = _fresh(seqs)
    assert kept.seqs == fresh.seqs
    assert kept.table.tolist() == fresh.table.tolist()
    assert kept.watches_eos() == fresh.watches_eos()


def test_kept_and_appended_rows_equal_a_fresh_gather() -> None:
    seqs = [_seq(i, 20 + 9 * i, 40 + i) for i in range(5)]
    seqs[2].max_tokens = 10_000  # its limit is max_model_len's
    columns = _fresh(seqs)
    assert columns.limits.tolist()[2] == MAX_MODEL_LEN
    # A stretch of 3 steps: sequences 1 and 3 finished; the others took 3 tokens each, and
    # sequence 4 a block (the stretch writes ``held`` in place).
    survivors = np.array([0, 2, 4])
    for seq in (seqs[0], seqs[2], seqs[4]):
        seq.extend_tokens([1, 2, 3])
    seqs[4].block_table.append(99)
    columns.held[4] += 1
    columns.keep(survivors, [seqs[0], seqs[2], seqs[4]], 3)
    everyone = [seqs[0], seqs[2], seqs[4]]
    for seq in everyone:  # a stretch in which none finished keeps every row (None)
        seq.extend_tokens([4])
    columns.keep(None, everyone, 1)
    admitted = _seq(9, 33, 5, ignore_eos=False)
    running = [seqs[0], seqs[2], seqs[4], admitted]
    table = columns.table
    columns.refresh(running, MAX_MODEL_LEN)
    assert columns.table[:3].tolist() == table.tolist()  # kept rows not gathered again
    _same(columns, running)
    assert columns.watches_eos()


def test_a_change_outside_a_stretch_gathers_every_row_again() -> None:
    seqs = [_seq(i, 30, 50) for i in range(4)]
    stepped = _fresh(seqs)
    seqs[1].extend_tokens([5])  # a per-step decode moved it
    stepped.refresh(seqs, MAX_MODEL_LEN)
    _same(stepped, seqs)
    removed = _fresh(seqs)
    removed.refresh([seqs[0], seqs[2], seqs[3]], MAX_MODEL_LEN)  # one preempted
    _same(removed, [seqs[0], seqs[2], seqs[3]])
    reordered = _fresh(seqs)
    reordered.refresh([seqs[1], seqs[0], seqs[2], seqs[3]], MAX_MODEL_LEN)
    _same(reordered, [seqs[1], seqs[0], seqs[2], seqs[3]])


def test_the_eos_watch_follows_the_rows_kept() -> None:
    seqs = [_seq(0, 30, 50), _seq(1, 30, 50, ignore_eos=False), _seq(2, 30, 50)]
    columns = _fresh(seqs)
    assert columns.watches_eos()
    for seq in (seqs[0], seqs[2]):
        seq.extend_tokens([1])
    columns.keep(np.array([0, 2]), [seqs[0], seqs[2]], 1)  # the watcher finished
    assert not columns.watches_eos()
    _same(columns, [seqs[0], seqs[2]])


def _tokens_of(seq_id: int, completion: int, count: int) -> list[int]:
    return [100 * seq_id + completion + i for i in range(count)]


def test_lagging_rows_are_synced_to_the_tokens_they_count() -> None:
    def stretched() -> tuple[RunningColumns, list[Sequence]]:
        seqs = [_seq(i, 20 + 9 * i, 40 + i) for i in range(3)]
        columns = _fresh(seqs)
        seqs[1].extend_tokens(_tokens_of(1, 1, 2))  # caught up in part inside the stretch
        columns.keep(np.array([0, 1, 2]), seqs, 4, lagging=True)
        return columns, seqs

    expected = [_seq(i, 20 + 9 * i, 40 + i) for i in range(3)]
    for seq in expected:
        seq.extend_tokens(_tokens_of(seq.seq_id, 1, 4))
    columns, seqs = stretched()
    assert [s.num_tokens for s in seqs] != [s.num_tokens for s in expected]
    table = columns.table
    columns.refresh(seqs, MAX_MODEL_LEN, _tokens_of)  # nothing gathered while they lag
    assert columns.table is table and columns.lagging
    columns.sync(_tokens_of)
    assert not columns.lagging
    assert [list(s.token_ids) for s in seqs] == [list(s.token_ids) for s in expected]
    assert [s.num_computed_tokens for s in seqs] == [s.num_computed_tokens for s in expected]
    _same(columns, seqs)
    columns, seqs = stretched()
    columns.refresh(seqs[1:], MAX_MODEL_LEN, _tokens_of)  # one left: every row gathered again
    assert [list(s.token_ids) for s in seqs] == [list(s.token_ids) for s in expected]
    _same(columns, seqs[1:])
