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

A stretch may leave its survivors' ``Sequence`` objects behind their token-count column
(``keep(..., lagging=True)``: their tokens not yet appended): the columns are then the truth, and
``sync`` appends what each lacks (from a ``TokensOf`` source: the executor's token rule) before
anything else reads them (``EngineCore`` hands ``sync`` to the scheduler as
``OverlapScheduler.sync_running``). While they lag, no step outside a stretch can have moved
them (that step would have synced them first), so ``refresh`` skips the token-count gather.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.sequence import Sequence

_num_tokens = attrgetter("num_tokens")
# The columns, in the order of ``RunningColumns.table``'s columns.
SEQ_ID, PROMPT_LEN, LIMIT, WATCH_EOS, NUM_TOKENS, HELD = range(6)
# The tokens a sequence sampled: (seq id, completion tokens it holds, how many more) -> token ids.
TokensOf = Callable[[int, int, int], "list[int] | array"]


def _column(index: int) -> property:
    """A read-only view of column ``index`` of ``RunningColumns.table``."""
    return property(lambda self: self.table[:, index])


class RunningColumns:
    """Columns of ``seqs`` (the running sequences, in running order), one row each in ``table``
    (int64): seq id, prompt length, the token count at which ``Scheduler._append_sampled``'s
    length rule ends it, whether it watches for EOS (not ``ignore_eos``), token count and blocks
    in its block table (see the column numbers above; the views ``seq_ids``, ``num_tokens``...)."""

    __slots__ = ("seqs", "table", "lagging", "_watching")

    def __init__(self) -> None:
        self.seqs: list[Sequence] = []
        self.table = np.zeros((0, 6), np.int64)
        self.lagging = False  # whether some ``Sequence`` lacks tokens its row counts (``sync``)
        self._watching = False  # whether any row watches for EOS

    seq_ids = _column(SEQ_ID)
    prompt_lens = _column(PROMPT_LEN)
    limits = _column(LIMIT)
    num_tokens = _column(NUM_TOKENS)
    held = _column(HELD)

    def watches_eos(self) -> bool:
        """Whether any running sequence watches for EOS."""
        return self._watching

    def refresh(self, seqs: list[Sequence], max_model_len: int,
                tokens_of: TokensOf | None = None) -> None:
        """Make the columns those of ``seqs`` (the running sequences, in order): the kept rows
        where ``seqs`` starts with the kept sequences, their token counts unchanged (not
        gathered while they lag: see the module docstring), and rows gathered for the sequences
        after them; otherwise every row gathered, lagging sequences synced first (``tokens_of``).
        Emits nothing."""
        kept = len(self.seqs)
        if kept and seqs[:kept] == self.seqs and (self.lagging or list(
                map(_num_tokens, self.seqs)) == self.table[:, NUM_TOKENS].tolist()):
            if len(seqs) > kept:
                self._append(seqs[kept:], max_model_len)
            return
        if self.lagging:
            if tokens_of is None:
                raise RuntimeError("running sequences lag their columns and no token source "
                                   "was given to bring them up to date")
            self.sync(tokens_of)
        self.seqs, self.table = [], self.table[:0]
        self._watching = False
        self._append(seqs, max_model_len)

    def sync(self, tokens_of: TokensOf) -> None:
        """Give each lagging ``Sequence`` the tokens its row counts and it lacks, in order, from
        ``tokens_of`` (``Sequence.extend_tokens``). Emits nothing."""
        if not self.lagging:
            return
        self.lagging = False
        for seq, count in zip(self.seqs, self.table[:, NUM_TOKENS].tolist()):
            owed = count - seq.num_tokens
            if owed > 0:
                seq.extend_tokens(
                    tokens_of(seq.seq_id, seq.num_tokens - seq.num_prompt_tokens, owed))

    def _append(self, seqs: list[Sequence], max_model_len: int) -> None:
        rows = [(seq.seq_id, seq.num_prompt_tokens,
                 min(seq.num_prompt_tokens + seq.max_tokens, max_model_len), not seq.ignore_eos,
                 seq.num_tokens, len(seq.block_table)) for seq in seqs]
        self.seqs = self.seqs + seqs
        self.table = np.concatenate([self.table, np.array(rows, np.int64).reshape(-1, 6)])
        self._watching = self._watching or any(row[WATCH_EOS] for row in rows)

    def keep(self, rows: np.ndarray | None, seqs: list[Sequence], steps: int,
             lagging: bool = False) -> None:
        """Keep only ``rows`` (indices, in order; None: every row), which are now ``seqs``,
        each ``steps`` tokens longer (their ``held`` brought up to date in place by the caller);
        ``lagging``: some of them do not hold those tokens yet (``sync``). Emits nothing."""
        table = self.table.copy() if rows is None else self.table[rows]
        table[:, NUM_TOKENS] += steps
        self.seqs, self.table = seqs, table
        self.lagging = self.lagging or lagging
        if self._watching:
            self._watching = bool(table[:, WATCH_EOS].any())
