"""Small prefills on CUDA: CUDA graphs captured per padded token count.

An eager prefill launches every kernel of every layer from Python; for small prefills the device
finishes each before the host has launched the next, so the step takes the host's launch time
(figures: docs/gpu-notes.md, "Where the numbers in the code went"). A recompute after
preemption, or a lone late prompt, pays that on every prefill. Here such a prefill is padded to
the next captured token count and replayed from a graph captured once at start-up: one launch,
its time set by the device.

Which token counts are captured, and which prefills pad to which: ``engine/graph_sizes.py``.

Inputs live in fixed buffers: rows past the batch's tokens are padding (token 0, position 0,
slot -1: the fused KV store skips them), sequences past the batch have no query tokens
(``cu_seqlens_q`` repeats the total), so the attention kernel's programs for them exit at once.
Attention always reads keys through the block table (``AttentionMetadata.paged_prefill``): the
batch is unknown at capture, and the fused kernel has stored the new keys before attention runs.

The rows sampled and their temperatures are staged with the inputs (pinned, copied without
blocking): a copy from pageable memory after the replay would wait for the whole graph, and the
logits and sampling launches would then start on an idle device.

One pinned host buffer serves every step of a graph kind: a mixed step may be launched while
the previous one is in flight (``Config.overlap_mixed_steps``), so staging first waits until the
device has taken the last copy out of it (an event recorded after the copies; a prefill step's
tokens are read back before the next step stages, so there it never waits).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from engine.graph_sizes import padded_prefill_tokens
from engine.model.attention_metadata import AttentionMetadata
from engine.runner.graph_capture import (
    NO_SOURCE,
    PAD_SLOT,
    ROW_IDS,
    ROW_POSITIONS,
    ROW_SLOTS,
    CapturedGraphs,
    ModelFn,
)
from engine.runner.staging import StagingBlock, StagingLayout

__all__ = ["PrefillGraphs", "StagedGraphs", "stage_prefill"]

# The int64 staging block's fourth row: the rows sampled; its fifth: per row, the row of the
# previous step's output holding its input token while that step is in flight (a mixed step's
# decode rows; ``graph_capture.take_sources``), else NO_SOURCE.
ROW_SAMPLE = 3
ROW_PENDING = 4
STAGED_ROWS = 5


def stage_prefill(
    i64: np.ndarray,
    i32: np.ndarray,
    tables: np.ndarray,
    input_ids: Sequence[int],
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    padded_tokens: int,
    max_seqs: int,
) -> None:
    """Fill the host staging arrays for one prefill (numpy, in place).

    ``i64`` ``[3, max_tokens]``: token ids, positions, cache slots (rows ``ROW_*``); ``i32``:
    ``cu_seqlens_q`` ``[max_seqs + 1]`` then ``context_lens`` ``[max_seqs]``; ``tables``
    ``[max_seqs, width]`` (only each sequence's own blocks are written: the kernels never read
    past them). Rows ``[tokens, padded_tokens)`` become padding.
    """
    num_seqs = len(query_lens)
    q = np.asarray(query_lens, dtype=np.int64)
    ctx = np.asarray(context_lens, dtype=np.int64)
    total = int(q.sum())
    cu = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(q, out=cu[1:])
    seq_of_token = np.repeat(np.arange(num_seqs), q)
    positions = np.arange(total) - (cu[:-1] - (ctx - q))[seq_of_token]
    for s, table in enumerate(block_tables):
        tables[s, : len(table)] = table
    blocks = tables[seq_of_token, positions // block_size].astype(np.int64)
    i64[ROW_IDS, :total] = input_ids
    i64[ROW_POSITIONS, :total] = positions
    i64[ROW_SLOTS, :total] = blocks * block_size + positions % block_size
    i64[ROW_IDS, total:padded_tokens] = 0
    i64[ROW_POSITIONS, total:padded_tokens] = 0
    i64[ROW_SLOTS, total:padded_tokens] = PAD_SLOT
    i32[: num_seqs + 1] = cu
    i32[num_seqs + 1 : max_seqs + 1] = total
    i32[max_seqs + 1 : max_seqs + 1 + num_seqs] = ctx
    i32[max_seqs + 1 + num_seqs : 2 * max_seqs + 1] = 0


class StagedGraphs(CapturedGraphs):
    """Captured graphs over one staging block (``staging.StagingBlock``), pinned on the host
    and mirrored on the device: an int64 block ``[STAGED_ROWS, max_rows]`` (``ROW_*``: ids,
    positions, slots, the rows sampled), an int32 block of ``header_ints`` (``cu_seqlens_q``,
    context lengths) followed by ``slots`` block-table rows of ``table_width``, and one
    temperature per slot. A subclass fills the host views (``_np_i64``, ``_np_i32``,
    ``_np_tables``) and calls ``_upload``."""

    def __init__(self, sizes: Sequence[Any], max_rows: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device, header_ints: int, slots: int, table_width: int) -> None:
        super().__init__(sizes, torch.zeros(max_rows, hidden_size, dtype=dtype, device=device))
        self.table_width = table_width
        pin = device.type == "cuda"
        layout = StagingLayout(STAGED_ROWS, max_rows, header_ints + slots * table_width, slots)
        self.host = StagingBlock(layout, pin=pin)
        self._np_i64 = self.host.i64.numpy()
        self._np_i32 = self.host.i32[:header_ints].numpy()
        self._np_tables = self.host.i32[header_ints:].view(slots, table_width).numpy()
        self._np_temps = self.host.f32.numpy()
        self._np_i64[ROW_SLOTS] = PAD_SLOT
        self._np_i64[ROW_PENDING] = NO_SOURCE
        self.dev = StagingBlock(layout, device)
        self.dev_i64, self.dev_i32, self.dev_temps = self.dev.i64, self.dev.i32, self.dev.f32
        self.dev_i64[ROW_SLOTS] = PAD_SLOT
        self.dev_i64[ROW_PENDING] = NO_SOURCE
        # Recorded after each upload: the host buffers may be rewritten once it has passed.
        self._uploaded = torch.cuda.Event() if pin else None

    def _wait_uploaded(self) -> None:
        """Block until the device has copied the host buffers of the last upload (at once
        unless a step launched before the last one finished is still queued ahead of it)."""
        if self._uploaded is not None:
            self._uploaded.synchronize()

    def _check_samples(self, sample_rows: Sequence[int], temperatures: Sequence[float]) -> None:
        if len(sample_rows) != len(temperatures) or len(sample_rows) > len(self._np_temps):
            raise ValueError("one temperature per sampled row, at most one row per sequence")

    def _upload(self, sample_rows: Sequence[int], temperatures: Sequence[float]) -> None:
        """Write the rows sampled (in the graph's row numbering) and their temperatures, then
        copy the host block to the device in one transfer without blocking (pinned memory)."""
        self._np_i64[ROW_SAMPLE, : len(sample_rows)] = sample_rows
        self._np_temps[: len(temperatures)] = temperatures
        self.dev.upload(self.host)
        if self._uploaded is not None:
            self._uploaded.record()

    def sampled(self, hidden: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The hidden states of the ``rows`` staged sample rows, and their temperatures."""
        return hidden.index_select(0, self.dev_i64[ROW_SAMPLE, :rows]), self.dev_temps[:rows]


class PrefillGraphs(StagedGraphs):
    """Persistent prefill inputs and one CUDA graph per captured token count."""

    def __init__(
        self,
        sizes: list[int],
        table_width: int,
        block_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        max_seqs: int,
    ) -> None:
        if not sizes:
            raise ValueError("PrefillGraphs needs at least one token count to capture")
        max_tokens = max(sizes)
        if max_seqs > max_tokens:
            raise ValueError(f"{max_seqs} sequences cannot fit the largest graph's {max_tokens} "
                             "tokens")
        super().__init__(sizes, max_tokens, hidden_size, dtype, device,
                         header_ints=2 * max_seqs + 1, slots=max_seqs, table_width=table_width)
        self.max_seqs = max_seqs
        self.block_size = block_size

    def padded_size(self, tokens: int, num_seqs: int) -> int:
        """The captured token count for this prefill; 0: it runs eager."""
        return padded_prefill_tokens(self.sizes, tokens, num_seqs, self.max_seqs)

    def stage(
        self,
        input_ids: Sequence[int],
        query_lens: Sequence[int],
        context_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        padded_tokens: int,
        sample_rows: Sequence[int] = (),
        temperatures: Sequence[float] = (),
    ) -> None:
        """Write one prefill's inputs (and the rows it samples, with their temperatures) to the
        host buffers and copy them to the device."""
        self._check_samples(sample_rows, temperatures)
        self._wait_uploaded()
        stage_prefill(self._np_i64, self._np_i32, self._np_tables, input_ids, query_lens,
                      context_lens, block_tables, self.block_size, padded_tokens, self.max_seqs)
        self._upload(sample_rows, temperatures)

    def metadata(self, padded_tokens: int) -> AttentionMetadata:
        """Metadata over the staged buffers (views: stable addresses for capture and replay)."""
        s = self.max_seqs
        cu = self.dev_i32[: s + 1]
        return AttentionMetadata(
            num_prefill_seqs=s,
            num_prefill_tokens=padded_tokens,
            num_decode_seqs=0,
            block_size=self.block_size,
            slot_mapping=self.dev_i64[ROW_SLOTS, :padded_tokens],
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,  # unused by the paged prefill kernel
            context_lens=self.dev_i32[s + 1 : 2 * s + 1],
            block_tables=self.dev_i32[2 * s + 1 :].view(s, self.table_width),
            # The longest prompt the graph can hold picks the attention's tiling: the block
            # table bounds it, not the padded count (prefill_attention.prefill_tiling).
            max_seqlen_q=min(padded_tokens, self.table_width * self.block_size),
            max_seqlen_k=padded_tokens,
            max_decode_seqlen_k=0,
            query_lens_host=(0,) * s,
            context_lens_host=(0,) * s,
            paged_prefill=True,
        )

    @torch.inference_mode()
    def capture(self, model: ModelFn) -> None:
        """Capture every token count over the staged buffers (all rows padding: no KV touched)."""
        self.stage([], [], [], [], self.sizes[-1])

        def forward_of(size: int) -> Callable[[], torch.Tensor]:
            metadata = self.metadata(size)
            ids, positions = self.dev_i64[ROW_IDS, :size], self.dev_i64[ROW_POSITIONS, :size]
            return lambda: model(ids, positions, metadata)

        self.capture_all(forward_of)

    def describe(self) -> dict[str, Any]:
        return {"prefill_graph_tokens": list(self.sizes), "prefill_graph_max_seqs": self.max_seqs}
