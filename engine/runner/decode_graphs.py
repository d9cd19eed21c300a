"""Decode steps on CUDA: persistent input buffers and CUDA graphs per padded batch size.

Decode inputs live in fixed buffers for the runner's lifetime: pinned host arrays filled with
numpy, copied to the device in one transfer per step (``staging.StagingBlock``), and read by
graphs captured once
for the batch sizes of ``engine.graph_sizes.decode_graph_sizes`` that share one memory pool.
Row ``i`` of every buffer is the ``i``-th decode sequence; rows past the batch are padding
(context 0, slot -1: attention outputs zeros and nothing is stored).

The block-table buffer is ``[max_batch, ceil(max_model_len / block_size)]``, fixed width so the
graphs never see another shape. Rows are updated incrementally: a sequence that stays in the
same row only gets its newly appended blocks written. Block tables change in two ways only:
a decode appends blocks, or preemption frees them all and a later prefill rebuilds them; so the
runner calls :meth:`DecodeBuffers.invalidate` after any step with prefill work.

With ``longest_first`` each step also stages its rows sorted by context length, longest first
(padding rows last): the order in which the decode attention kernel's programs take them, so a
long row does not start last and run alone at the end of the launch (the kernel's docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from engine.graph_sizes import decode_graph_sizes, padded_decode_size
from engine.model.attention_metadata import AttentionMetadata, rows_longest_first
from engine.runner.graph_capture import (
    NO_SOURCE,
    PAD_SLOT,
    ROW_IDS,
    ROW_POSITIONS,
    ROW_SLOTS,
    CapturedGraphs,
    ModelFn,
    take_sources,
)
from engine.runner.staging import StagingBlock, StagingLayout

# The int64 staging block's fourth row: for a token still being sampled by the previous
# (overlapped) step, its row in that step's output.
ROW_SOURCE = 3
HOST_STAGES = 2


class _HostStage:
    """One set of pinned host staging arrays, and what its block-table rows hold.

    The int32 block: context lengths ``[max_batch]``, the row order ``[max_batch]``, then the
    block tables ``[max_batch, table_width]``.
    """

    def __init__(self, layout: StagingLayout, table_width: int, pin: bool) -> None:
        self.block = StagingBlock(layout, pin=pin)
        max_batch = layout.i64_cols
        self.np_i64 = self.block.i64.numpy()
        i32 = self.block.i32
        self.np_ctx = i32[:max_batch].numpy()
        self.np_order = i32[max_batch : 2 * max_batch].numpy()  # written by every stage
        self.np_tables = i32[2 * max_batch :].view(max_batch, table_width).numpy()
        self.np_temps = self.block.f32.numpy()
        self.np_i64[ROW_SLOTS] = PAD_SLOT
        self.np_i64[ROW_SOURCE] = NO_SOURCE
        self.row_seq: list[int] = [-1] * max_batch
        self.row_blocks = [0] * max_batch


class DecodeBuffers:
    """Pinned host staging plus device copies of one decode step's inputs.

    Two host staging sets alternate: with overlapped steps the next step is staged while the
    previous step's host-to-device copy may still be queued, so it must not reuse its arrays.

    Two ways in, one per caller, sharing :meth:`_fill` (tables, slots, and the checks that the
    block table fits the buffer and holds the context): :meth:`stage` takes a ``StepPayload``'s
    lists, which is all a tensor-parallel rank has (rank 0 ran ``check_batch`` before it
    broadcast them); :meth:`stage_sequences` reads the scheduler's sequences directly on one
    GPU, the hot path, where building lists and running ``check_batch`` per sequence would add
    host time to every decode step; it checks, vectorised, what ``check_batch`` would have
    caught for a decode (context == tokens, table holds it, block ids in the pool).
    """

    def __init__(
        self, max_batch: int, table_width: int, block_size: int, device: torch.device,
        longest_first: bool = False,
    ) -> None:
        self.max_batch = max_batch
        self.table_width = table_width
        self.block_size = block_size
        self.longest_first = longest_first
        pin = device.type == "cuda"
        layout = StagingLayout(ROW_SOURCE + 1, max_batch, max_batch * (2 + table_width),
                               max_batch)
        self._stages = [_HostStage(layout, table_width, pin) for _ in range(HOST_STAGES)]
        self._turn = 0
        self._use(0)
        self.dev = StagingBlock(layout, device)
        self.dev_i64, self.dev_i32, self.dev_temps = self.dev.i64, self.dev.i32, self.dev.f32
        self.dev_cu_seqlens = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self._rows = np.arange(max_batch)

    def _use(self, index: int) -> None:
        stage = self._stages[index]
        self.host = stage.block
        self.np_i64, self.np_ctx, self.np_tables = stage.np_i64, stage.np_ctx, stage.np_tables
        self.np_order = stage.np_order
        self.np_temps = stage.np_temps
        self._row_seq, self._row_blocks = stage.row_seq, stage.row_blocks

    def _next_stage(self) -> None:
        self._turn = (self._turn + 1) % HOST_STAGES
        self._use(self._turn)

    # device views the model (and the graphs) read
    @property
    def input_ids(self) -> torch.Tensor:
        return self.dev_i64[ROW_IDS]

    @property
    def positions(self) -> torch.Tensor:
        return self.dev_i64[ROW_POSITIONS]

    @property
    def slot_mapping(self) -> torch.Tensor:
        return self.dev_i64[ROW_SLOTS]

    @property
    def context_lens(self) -> torch.Tensor:
        return self.dev_i32[: self.max_batch]

    @property
    def row_order(self) -> torch.Tensor:
        return self.dev_i32[self.max_batch : 2 * self.max_batch]

    @property
    def block_tables(self) -> torch.Tensor:
        return self.dev_i32[2 * self.max_batch :].view(self.max_batch, self.table_width)

    @property
    def temperatures(self) -> torch.Tensor:
        return self.dev_temps

    def invalidate(self) -> None:
        """Forget which sequence each row holds (block tables may have been rebuilt)."""
        for stage in self._stages:
            stage.row_seq[:] = [-1] * self.max_batch

    def stage(
        self,
        seq_ids: Sequence[int],
        input_ids: Sequence[int],
        context_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        temperatures: Sequence[float],
        padded: int,
    ) -> None:
        """Fill rows ``[0, n)`` from the step's inputs and ``[n, padded)`` as padding, then
        start the host-to-device copies (asynchronous, ordered before the step's kernels).
        """
        self._next_stage()
        ids = self.np_i64[ROW_IDS]
        ids[: len(seq_ids)] = input_ids
        self.np_i64[ROW_SOURCE, : len(seq_ids)] = NO_SOURCE
        self.np_temps[: len(seq_ids)] = temperatures
        self._fill(seq_ids, block_tables, context_lens, padded)

    def stage_sequences(
        self,
        seqs: Sequence[Any],
        context_lens: Sequence[int],
        padded: int,
        num_blocks: int,
        sources: Sequence[int] | None = None,
        values: dict[int, int] | None = None,
    ) -> None:
        """:meth:`stage` straight from the scheduler's ``Sequence`` objects (no payload lists),
        checking what a decode step could get wrong: each sequence's context is its length,
        its table holds the context, and the block written this step exists.

        ``sources``: per row, the previous step's output row whose token is this row's input
        (``NO_SOURCE``: the host token); :meth:`take_sources` applies them on the device.
        ``values``: seq_id -> token for pending tokens already on the host.
        """
        self._next_stage()
        n = len(seqs)
        ids = self.np_i64[ROW_IDS]
        if values:
            ids[:n] = [values.get(seq.seq_id, seq.last_token) for seq in seqs]
        else:
            ids[:n] = [seq.last_token for seq in seqs]
        self.np_i64[ROW_SOURCE, :n] = NO_SOURCE if sources is None else sources
        self.np_temps[:n] = [seq.temperature for seq in seqs]
        lengths = [seq.num_tokens for seq in seqs]
        if lengths != list(context_lens):
            bad = next(i for i, (a, b) in enumerate(zip(lengths, context_lens)) if a != b)
            raise ValueError(
                f"seq {seqs[bad].seq_id}: a decode needs context_len == tokens "
                f"({context_lens[bad]} != {lengths[bad]})"
            )
        block_ids = self._fill(
            [seq.seq_id for seq in seqs], [seq.block_table for seq in seqs], context_lens, padded
        )
        wrong = (block_ids < 0) | (block_ids >= num_blocks)
        if wrong.any():
            bad = int(np.argmax(wrong))
            raise ValueError(
                f"seq {seqs[bad].seq_id}: block id {int(block_ids[bad])} outside [0, {num_blocks})"
            )

    def _fill(
        self,
        seq_ids: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        context_lens: Sequence[int],
        padded: int,
    ) -> np.ndarray:
        """Tables, positions, slots, contexts and padding; returns the block of each new token."""
        n = len(seq_ids)
        ctx = np.asarray(context_lens, dtype=np.int64)
        tables = self.np_tables
        row_seq, row_blocks = self._row_seq, self._row_blocks
        for i, (seq_id, table) in enumerate(zip(seq_ids, block_tables)):
            have = row_blocks[i] if row_seq[i] == seq_id else 0
            if have != len(table):
                if len(table) > self.table_width:
                    raise ValueError(
                        f"seq {seq_id}: {len(table)} blocks exceed the block-table width "
                        f"{self.table_width} (max_model_len)"
                    )
                tables[i, have : len(table)] = table[have:]
                row_seq[i] = seq_id
                row_blocks[i] = len(table)
        last = ctx - 1
        short = np.asarray(row_blocks[:n]) * self.block_size <= last
        if short.any():
            bad = int(np.argmax(short))
            raise ValueError(
                f"seq {seq_ids[bad]}: block table of {row_blocks[bad]} blocks cannot hold "
                f"{context_lens[bad]} tokens of block size {self.block_size}"
            )
        block_ids = tables[self._rows[:n], last // self.block_size]
        self.np_i64[ROW_POSITIONS, :n] = last
        self.np_i64[ROW_SLOTS, :n] = block_ids.astype(np.int64) * self.block_size + (
            last % self.block_size
        )
        self.np_ctx[:n] = ctx
        # Padding rows: position 0 and token 0 are valid inputs; context 0 and slot -1 make the
        # kernels skip them.
        self.np_i64[ROW_IDS, n:padded] = 0
        self.np_i64[ROW_POSITIONS, n:padded] = 0
        self.np_i64[ROW_SLOTS, n:padded] = PAD_SLOT
        self.np_ctx[n:padded] = 0
        if self.longest_first:
            self.np_order[:padded] = rows_longest_first(self.np_ctx[:padded])
        self.dev.upload(self.host)
        return block_ids

    def take_sources(self, batch: int, previous_tokens: torch.Tensor) -> None:
        """Input ids of rows with a source: the previous step's sampled token, read on the
        device (stream order puts it after that step's sampler), never through the host."""
        take_sources(self.dev_i64[ROW_IDS, :batch], self.dev_i64[ROW_SOURCE, :batch],
                     previous_tokens)

    def metadata(
        self,
        batch: int,
        max_context: int,
        context_lens_host: tuple[int, ...] | None = None,
    ) -> AttentionMetadata:
        """Decode-only metadata over the first ``batch`` rows (views, stable addresses).

        ``cu_seqlens_k`` is not a real cumulative sum here: decode kernels read
        ``context_lens`` instead, and computing it would cost a device op per step.
        ``decode_order`` (with ``longest_first``) holds the staged order of rows ``[0, batch)``:
        ``batch`` must be the size :meth:`stage` padded to.
        """
        return AttentionMetadata(
            num_prefill_seqs=0,
            num_prefill_tokens=0,
            num_decode_seqs=batch,
            block_size=self.block_size,
            slot_mapping=self.slot_mapping[:batch],
            cu_seqlens_q=self.dev_cu_seqlens[: batch + 1],
            cu_seqlens_k=self.dev_cu_seqlens[: batch + 1],
            context_lens=self.context_lens[:batch],
            block_tables=self.block_tables[:batch],
            max_seqlen_q=0,
            max_seqlen_k=0,
            max_decode_seqlen_k=max_context,
            query_lens_host=(1,) * batch,
            context_lens_host=context_lens_host or (max_context,) * batch,
            decode_order=self.row_order[:batch] if self.longest_first else None,
        )


class DecodeGraphs(CapturedGraphs):
    """One CUDA graph per padded batch size, all replaying over :class:`DecodeBuffers`."""

    def __init__(
        self, buffers: DecodeBuffers, hidden_size: int, dtype: torch.dtype, max_context: int
    ) -> None:
        outputs = torch.zeros(
            buffers.max_batch, hidden_size, dtype=dtype, device=buffers.dev_i64.device
        )
        super().__init__(decode_graph_sizes(buffers.max_batch), outputs)
        self.buffers = buffers
        self.max_context = max_context

    def padded_size(self, batch: int) -> int | None:
        """The smallest captured size that holds ``batch`` rows (None: too big, run eager)."""
        return padded_decode_size(self.sizes, batch) or None

    @torch.inference_mode()
    def capture(self, model: ModelFn) -> None:
        """Capture every batch size over the staged buffers (all rows padding: no KV touched)."""
        buffers = self.buffers
        buffers.stage([], [], [], [], [], buffers.max_batch)

        def forward_of(size: int) -> Callable[[], torch.Tensor]:
            metadata = buffers.metadata(size, self.max_context)
            ids, positions = buffers.input_ids[:size], buffers.positions[:size]
            return lambda: model(ids, positions, metadata)

        self.capture_all(forward_of)
