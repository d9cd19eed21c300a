"""A point of the device profile's grid (engine/profiling.py): one synthetic step shape and the
``ScheduledBatch`` that runs it over block tables laid out as the engine's would be."""

from __future__ import annotations

from dataclasses import dataclass

from engine.batch import ScheduledBatch
from engine.calibration import synthetic_sequences


@dataclass(frozen=True)
class ProfilePoint:
    """One grid shape. ``decode_contexts``: each decode row's context; ``prompts``: each
    prefill (or chunk) row's (tokens computed, cached prefix tokens); ``prefix_groups``,
    ``prefix_tokens``: the decode rows share ``prefix_tokens`` (whole blocks) of their contexts
    with the other rows of their group (row i in group i mod ``prefix_groups``; 0: none)."""

    kind: str
    level: int
    decode_contexts: tuple[int, ...] = ()
    prompts: tuple[tuple[int, int], ...] = ()
    eager: bool = False
    label: str = ""
    prefix_groups: int = 0
    prefix_tokens: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.prompts) + len(self.decode_contexts)

    def block_tables(self, block_size: int) -> list[list[int]]:
        """Each row's blocks, prefill rows first: distinct consecutive blocks (so attention reads
        as much memory as a real batch), but a group's shared prefix is the same blocks at the
        head of each of its rows' tables, as the prefix cache lays it out."""
        lengths = [new + cached for new, cached in self.prompts] + list(self.decode_contexts)
        shared = self.prefix_tokens // block_size if self.prefix_groups else 0
        prefixes = [list(range(g * shared, (g + 1) * shared)) for g in range(self.prefix_groups)]
        start = shared * self.prefix_groups
        tables = []
        for row, length in enumerate(lengths):
            decode_row = row - len(self.prompts)
            head = prefixes[decode_row % self.prefix_groups] if shared and decode_row >= 0 else []
            own = (length + block_size - 1) // block_size - len(head)
            tables.append(head + list(range(start, start + own)))
            start += own
        return tables

    def blocks(self, block_size: int) -> int:
        """The pool blocks the point holds (a shared block once)."""
        return len({block for table in self.block_tables(block_size) for block in table})

    def batch(self, block_size: int) -> ScheduledBatch:
        """The synthetic ``ScheduledBatch``: prefill rows first, decodes last, over the blocks
        of ``block_tables``."""
        lengths = [new + cached for new, cached in self.prompts] + list(self.decode_contexts)
        seqs = synthetic_sequences(lengths, 0, block_size)
        new = [n for n, _ in self.prompts] + [1] * len(self.decode_contexts)
        for seq, length, count, table in zip(seqs, lengths, new, self.block_tables(block_size)):
            seq.num_computed_tokens = length - count
            seq.block_table = table
        return ScheduledBatch(-1, self.kind, seqs, new, lengths, len(self.prompts),
                              num_batched_tokens=sum(new), sampled_seqs=seqs, eager=self.eager)
