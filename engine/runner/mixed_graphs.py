"""Mixed steps (prompt chunks and decodes together) on CUDA: graphs per (prefill, decode) size.

Under the chunked policy most steps before the last prompt is in carry prompt chunks and the
running decodes together. Run eager, such a step pays the host's launch time (about 400 kernels
from Python, docs/gpu-notes.md) and, because its decode rows start at an arbitrary row, hit
Triton kernel variants specialised on unaligned pointers that start-up never compiled. Here a
mixed step pads its prefill part to one of the prefill graphs' token counts ``T`` (up to
``MAX_MIXED_GRAPH_TOKENS``: ``engine/graph_sizes.py``) and its decode
rows to one of a few decode capacities ``D``, and replays the graph captured for ``(T, D)``.

Row layout of a graph ``(T, D)``: rows ``[0, T)`` are the prefill part, exactly as in a prefill
graph (``engine/runner/prefill_graphs.py``: up to ``MIXED_GRAPH_PREFILL_SEQS`` sequences, padding
rows inert, padding sequences empty); rows ``[T, T + D)`` are decode rows, one query each, read
by the decode kernel; padding decode rows have context length 0 (no keys read, output zeros)
and slot -1. Sequence slots: ``[0, S)`` prefill (``S = MIXED_GRAPH_PREFILL_SEQS``), ``[S, S + D)``
decodes, so the decode part's context lengths and block tables start at aligned addresses.

Which steps take which graph: ``mixed_graph_key``; the decode capacities: ``mixed_decode_sizes``.
With ``longest_first`` the decode rows are also staged longest context first, the order the
decode kernel's programs take them (as ``engine/runner/decode_graphs.py`` does for decodes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from engine.graph_sizes import MIXED_GRAPH_PREFILL_SEQS, mixed_decode_sizes, mixed_graph_key
from engine.model.attention_metadata import AttentionMetadata, rows_longest_first
from engine.runner.graph_capture import (
    NO_SOURCE,
    PAD_SLOT,
    ROW_IDS,
    ROW_POSITIONS,
    ROW_SLOTS,
    ModelFn,
    take_sources,
)
from engine.runner.prefill_graphs import ROW_PENDING, StagedGraphs, stage_prefill

__all__ = ["MixedGraphs", "mixed_decode_sizes", "mixed_graph_key", "stage_mixed"]

MixedKey = tuple[int, int]  # (padded prefill tokens, decode rows)


def stage_mixed(
    i64: np.ndarray,
    i32: np.ndarray,
    tables: np.ndarray,
    input_ids: Sequence[int],
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    num_prefill_seqs: int,
    block_size: int,
    key: MixedKey,
    max_prefill_seqs: int = MIXED_GRAPH_PREFILL_SEQS,
    sources: Sequence[int] | None = None,
    order: np.ndarray | None = None,
) -> None:
    """Fill the host staging arrays for one mixed step of graph ``key`` (numpy, in place).

    ``i64`` ``[5, rows]``: ids, positions, slots, (sampled rows: not written here), sources;
    ``i32``: ``cu_seqlens_q`` ``[S + 1]`` then context lengths ``[S + max decodes]``; ``tables``
    ``[S + max decodes, width]``. ``sources``: per decode, the row of the previous step's output
    holding its input token (``NO_SOURCE``: its id is the one given); None: every id is given.
    ``order`` (int32, at least the graph's decode rows): filled with the decode rows sorted by
    context, longest first, padding rows last; None: not staged.
    """
    tokens, rows = key
    s = max_prefill_seqs
    p = num_prefill_seqs
    prefill_tokens = int(sum(query_lens[:p]))
    stage_prefill(i64, i32[: 2 * s + 1], tables, input_ids[:prefill_tokens], query_lens[:p],
                  context_lens[:p], block_tables[:p], block_size, tokens, s)
    n = len(query_lens) - p
    ctx = np.asarray(context_lens[p:], dtype=np.int64)
    for j, table in enumerate(block_tables[p:]):
        tables[s + j, : len(table)] = table
    pos = ctx - 1
    blocks = tables[s + np.arange(n), pos // block_size].astype(np.int64)
    i64[ROW_IDS, tokens : tokens + n] = input_ids[prefill_tokens:]
    i64[ROW_POSITIONS, tokens : tokens + n] = pos
    i64[ROW_SLOTS, tokens : tokens + n] = blocks * block_size + pos % block_size
    i64[ROW_IDS, tokens + n : tokens + rows] = 0
    i64[ROW_POSITIONS, tokens + n : tokens + rows] = 0
    i64[ROW_SLOTS, tokens + n : tokens + rows] = PAD_SLOT
    # Every row of the graph: a row left from a step of another key must not take a token.
    i64[ROW_PENDING, : tokens + rows] = NO_SOURCE
    if sources is not None:
        i64[ROW_PENDING, tokens : tokens + n] = sources
    i32[2 * s + 1 : 2 * s + 1 + n] = ctx
    i32[2 * s + 1 + n : 2 * s + 1 + rows] = 0
    if order is not None:
        order[:rows] = rows_longest_first(i32[2 * s + 1 : 2 * s + 1 + rows])


def graph_rows(sample_rows: Sequence[int], prefill_tokens: int, padded_tokens: int) -> list[int]:
    """Flat-batch rows (prefill tokens, then one per decode) as rows of the graph's layout."""
    shift = padded_tokens - prefill_tokens
    return [r if r < prefill_tokens else r + shift for r in sample_rows]


class MixedGraphs(StagedGraphs):
    """Persistent mixed-step inputs and one CUDA graph per (prefill tokens, decode rows)."""

    def __init__(
        self,
        prefill_sizes: list[int],
        decode_sizes: list[int],
        table_width: int,
        block_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        max_prefill_seqs: int = MIXED_GRAPH_PREFILL_SEQS,
        longest_first: bool = False,
    ) -> None:
        if not prefill_sizes or not decode_sizes:
            raise ValueError("MixedGraphs needs prefill token counts and decode capacities")
        keys = [(t, d) for t in prefill_sizes for d in decode_sizes]
        self.prefill_sizes = sorted(prefill_sizes)
        self.decode_sizes = sorted(decode_sizes)
        self.max_prefill_seqs = s = max_prefill_seqs
        self.max_decodes = max(decode_sizes)
        self.block_size = block_size
        self.longest_first = longest_first
        slots = s + self.max_decodes
        # int32 header: cu_seqlens_q [S + 1], context lengths [slots], the decode rows' order.
        self._order_at = s + 1 + slots
        self._header_ints = self._order_at + self.max_decodes
        super().__init__(keys, max(prefill_sizes) + max(decode_sizes), hidden_size, dtype, device,
                         header_ints=self._header_ints, slots=slots, table_width=table_width)

    def rows(self, key: Any) -> int:
        tokens, decodes = key
        return int(tokens + decodes)

    def key(self, prefill_tokens: int, num_prefill_seqs: int, num_decodes: int) -> MixedKey | None:
        """The graph for this mixed step; None: it runs eager."""
        return mixed_graph_key(self.prefill_sizes, self.decode_sizes, prefill_tokens,
                               num_prefill_seqs, num_decodes)

    def stage(
        self,
        input_ids: Sequence[int],
        query_lens: Sequence[int],
        context_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        num_prefill_seqs: int,
        key: MixedKey,
        sample_rows: Sequence[int] = (),
        temperatures: Sequence[float] = (),
        sources: Sequence[int] | None = None,
        previous_tokens: torch.Tensor | None = None,
    ) -> None:
        """Write one mixed step's inputs, its sampled rows (flat-batch numbering) and their
        temperatures to the host buffers and copy them to the device; ``sources`` (per decode,
        see ``stage_mixed``) then take their input tokens from ``previous_tokens``, the sampled
        tokens of the step before, on the device."""
        self._check_samples(sample_rows, temperatures)
        self._wait_uploaded()
        order = self._np_i32[self._order_at :] if self.longest_first else None
        stage_mixed(self._np_i64, self._np_i32[: self._order_at], self._np_tables, input_ids,
                    query_lens, context_lens, block_tables, num_prefill_seqs, self.block_size,
                    key, self.max_prefill_seqs, sources, order)
        prefill_tokens = int(sum(query_lens[:num_prefill_seqs]))
        self._upload(graph_rows(sample_rows, prefill_tokens, key[0]), temperatures)
        if sources is not None:
            if previous_tokens is None:
                raise ValueError("sources given without the previous step's tokens")
            rows = self.rows(key)
            take_sources(self.dev_i64[ROW_IDS, :rows], self.dev_i64[ROW_PENDING, :rows],
                         previous_tokens)

    def metadata(self, key: MixedKey) -> AttentionMetadata:
        """Metadata of graph ``key`` over the staged buffers (views: stable addresses)."""
        tokens, decodes = key
        s = self.max_prefill_seqs
        slots = s + self.max_decodes
        cu = self.dev_i32[: s + 1]
        return AttentionMetadata(
            num_prefill_seqs=s,
            num_prefill_tokens=tokens,
            num_decode_seqs=decodes,
            block_size=self.block_size,
            slot_mapping=self.dev_i64[ROW_SLOTS, : tokens + decodes],
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,  # unused by the paged prefill kernel
            context_lens=self.dev_i32[s + 1 : s + 1 + s + decodes],
            block_tables=self.dev_i32[self._header_ints :].view(slots, self.table_width)[
                : s + decodes
            ],
            max_seqlen_q=tokens,
            max_seqlen_k=tokens,
            max_decode_seqlen_k=0,
            query_lens_host=(0,) * s + (1,) * decodes,
            context_lens_host=(0,) * (s + decodes),
            paged_prefill=True,
            decode_order=(self.dev_i32[self._order_at : self._order_at + decodes]
                          if self.longest_first else None),
        )

    @torch.inference_mode()
    def capture(self, model: ModelFn, pool: Any = None) -> None:
        """Capture every key over all-padding inputs (no KV touched); ``pool``: a graph memory
        pool to share (the prefill graphs', so the two kinds reserve the larger, not the sum)."""
        largest = (self.prefill_sizes[-1], self.decode_sizes[-1])
        self.stage([], [], [], [], 0, largest)
        self.pool = pool

        def forward_of(key: Any) -> Callable[[], torch.Tensor]:
            metadata = self.metadata(key)
            rows = self.rows(key)
            ids, positions = self.dev_i64[ROW_IDS, :rows], self.dev_i64[ROW_POSITIONS, :rows]
            return lambda: model(ids, positions, metadata)

        self.capture_all(forward_of)

    def describe(self) -> dict[str, Any]:
        return {"mixed_graph_decode_rows": list(self.decode_sizes)}
