"""The running sequences' columns a decode stretch plans from, kept from one stretch to the next.

A decode stretch (``engine.decode_stretch``) plans from each running sequence's id, prompt
length, length limit, ``ignore_eos``, token count and KV blocks held. Gathering them from the
``Sequence`` objects costs a Python call per sequence and column, once per stretch, although from
one stretch to the next the running set changes only by the sequences admitted at its end and
those that finished inside it. ``RunningColumns`` keeps them as numpy columns in running order:
the stretch hands back the survivors' columns as it leaves them (``keep``), and ``refresh`` gathers
only the token counts (to prove that no step outside a stretch moved a sequence) and the columns
of sequences not seen before; any other change to the running set gathers everything again.
The columns are bookkeeping only: the scheduler and block manager still decide everything.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.sequence import Sequence

_num_tokens = attrgetter("num_tokens")
# The columns, in the order of ``RunningColumns.table``'s columns.
SEQ_ID, PROMPT_LEN, LIMIT, WATCH_EOS, NUM_TOKENS, HELD = range(6)


def _column(index: int) -> property:
    """A read-only view of column ``index`` of ``RunningColumns.table``."""
    return property(lambda self: self.table[:, index])


class RunningColumns:
    """Columns of ``seqs`` (the running sequences, in running order), one row each in ``table``
    (int64): seq id, prompt length, the token count at which ``Scheduler._append_sampled``'s
    length rule ends it, whether it watches for EOS (not ``ignore_eos``), token count and blocks
    in its block table (see the column numbers above; the views ``seq_ids``, ``num_tokens``...)."""

    __slots__ = ("seqs", "table", "_token_counts", "_watching")

    def __init__(self) -> None:
        self.seqs: list[Sequence] = []
        self.table = np.zeros((0, 6), np.int64)
        self._token_counts: list[int] = []  # ``num_tokens`` as a list, to compare with
        self._watching = False  # whether any row watches for EOS

    seq_ids = _column(SEQ_ID)
    prompt_lens = _column(PROMPT_LEN)
    limits = _column(LIMIT)
    num_tokens = _column(NUM_TOKENS)
    held = _column(HELD)

    def watches_eos(self) -> bool:
        """Whether any running sequence watches for EOS."""
        return self._watching

    def refresh(self, seqs: list[Sequence], max_model_len: int) -> None:
        """Make the columns those of ``seqs`` (the running sequences, in order): the kept rows
        where ``seqs`` starts with the kept sequences, their token counts unchanged, and rows
        gathered for the sequences after them; otherwise every row gathered. Emits nothing."""
        kept = len(self.seqs)
        if kept and seqs[:kept] == self.seqs and \
                list(map(_num_tokens, self.seqs)) == self._token_counts:
            if len(seqs) > kept:
                self._append(seqs[kept:], max_model_len)
            return
        self.seqs, self.table, self._token_counts = [], self.table[:0], []
        self._watching = False
        self._append(seqs, max_model_len)

    def _append(self, seqs: list[Sequence], max_model_len: int) -> None:
        rows = [(seq.seq_id, seq.num_prompt_tokens,
                 min(seq.num_prompt_tokens + seq.max_tokens, max_model_len), not seq.ignore_eos,
                 seq.num_tokens, len(seq.block_table)) for seq in seqs]
        self.seqs = self.seqs + seqs
        self.table = np.concatenate([self.table, np.array(rows, np.int64).reshape(-1, 6)])
        self._token_counts = self._token_counts + [row[NUM_TOKENS] for row in rows]
        self._watching = self._watching or any(row[WATCH_EOS] for row in rows)

    def keep(self, rows: np.ndarray, seqs: list[Sequence], steps: int) -> None:
        """Keep only ``rows`` (indices, in order), which are now ``seqs``, each ``steps`` tokens
        longer (their ``held`` brought up to date in place by the caller). Emits nothing."""
        table = self.table[rows]
        table[:, NUM_TOKENS] += steps
        self.seqs, self.table = seqs, table
        self._token_counts = table[:, NUM_TOKENS].tolist()
        if self._watching:
            self._watching = bool(table[:, WATCH_EOS].any())
