"""CUDA-graph mixed steps: the graph choice, input staging, and the eager path's alignment.

The staged buffers of a mixed graph ``(T, D)`` must describe the batch ``build_attention_metadata``
describes for the eager path: the prefill part as a prefill graph stages it (rows ``[0, T)``),
the decode rows at rows ``[T, T + n)`` and sequence slots ``[S, S + n)``, every padding row inert
(slot -1) and every padding decode row without context. The model over these buffers is checked
against the eager path in ``test_prefill_graphs_model.py`` (Triton) and on the GPU in
``test_gpu_runner.py``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine.graph_sizes import (
    MAX_MIXED_GRAPH_TOKENS,
    MIXED_GRAPH_PREFILL_SEQS,
    mixed_prefill_sizes,
    prefill_graph_sizes,
)
from engine.model.attention_metadata import build_attention_metadata
from engine.runner.graph_capture import NO_SOURCE, PAD_SLOT, ROW_IDS, ROW_POSITIONS
from engine.runner.mixed_graphs import MixedGraphs, graph_rows, mixed_decode_sizes, mixed_graph_key
from engine.runner.step_inputs import PREFILL_SEQ_ALIGN, aligned_prefill_part

BLOCK_SIZE = 16
TABLE_WIDTH = 8
S = MIXED_GRAPH_PREFILL_SEQS


def test_decode_capacities_end_at_the_largest_batch() -> None:
    assert mixed_decode_sizes(512) == [32, 128, 256, 512]
    assert mixed_decode_sizes(300) == [32, 128, 256, 300]
    assert mixed_decode_sizes(64) == [32, 64]
    assert mixed_decode_sizes(8) == [8]


def test_graph_key_pads_both_parts_or_runs_eager() -> None:
    tokens, decodes = prefill_graph_sizes(4096), mixed_decode_sizes(256)
    assert mixed_graph_key(tokens, decodes, 2046, 3, 2) == (2048, 32)
    assert mixed_graph_key(tokens, decodes, 1800, 5, 129) == (2048, 256)
    assert mixed_graph_key(tokens, decodes, 100, 1, 0) is None  # no decodes: a prefill graph
    assert mixed_graph_key(tokens, decodes, 4097, 1, 4) is None  # too many tokens
    assert mixed_graph_key(tokens, decodes, 100, S + 1, 4) is None  # too many prompts
    assert mixed_graph_key(tokens, decodes, 100, 1, 257) is None  # too many decodes


def test_mixed_graphs_take_prompt_parts_to_4096_tokens_whatever_the_prefill_graphs() -> None:
    """Prefill graphs to 16,384 tokens (today's default) leave the mixed graphs' prompt parts at
    4,096: each prompt-part count multiplies the decode capacities captured."""
    tokens, decodes = prefill_graph_sizes(16384), mixed_decode_sizes(256)
    assert mixed_prefill_sizes(tokens) == prefill_graph_sizes(MAX_MIXED_GRAPH_TOKENS)
    assert mixed_graph_key(tokens, decodes, 4000, 2, 8) == (4096, 32)
    assert mixed_graph_key(tokens, decodes, 4097, 2, 8) is None  # a prefill graph holds it


@st.composite
def mixed_batches(draw: st.DrawFn) -> tuple[list[int], list[int], list[list[int]], int]:
    """Query and context lengths, tables and the prefill count of a mixed batch."""
    num_prefill = draw(st.integers(1, 5))
    num_decodes = draw(st.integers(1, 20))
    query, context, tables = [], [], []
    for i in range(num_prefill + num_decodes):
        ctx = draw(st.integers(1, BLOCK_SIZE * TABLE_WIDTH))
        query.append(draw(st.integers(1, ctx)) if i < num_prefill else 1)
        context.append(ctx)
        blocks = -(-ctx // BLOCK_SIZE)
        tables.append(draw(st.lists(st.integers(0, 200), min_size=blocks, max_size=blocks)))
    return query, context, tables, num_prefill


def _graphs() -> MixedGraphs:
    return MixedGraphs(prefill_graph_sizes(1024), mixed_decode_sizes(32), TABLE_WIDTH,
                       BLOCK_SIZE, 4, torch.float32, torch.device("cpu"))


@given(mixed_batches(), st.data())
def test_staged_buffers_match_the_eager_metadata(batch, data) -> None:  # type: ignore[no-untyped-def]
    query, context, tables, p = batch
    n = len(query) - p
    graphs = _graphs()
    # Stale values from an earlier, larger step must not leak into this one.
    graphs.stage(list(range(132)), [100] + [1] * 32, [100] + [50] * 32,
                 [list(range(TABLE_WIDTH))] * 33, 1, (128, 32))
    total = sum(query)
    ids = data.draw(st.lists(st.integers(0, 1000), min_size=total, max_size=total))
    prefill_tokens = sum(query[:p])
    key = graphs.key(prefill_tokens, p, n)
    assert key is not None
    tokens, rows = key
    rows_of = graph_rows(range(total), prefill_tokens, tokens)
    last = [sum(query[: i + 1]) - 1 for i in range(len(query))]  # each sequence's last row
    graphs.stage(ids, query, context, tables, p, key, last, [0.5] * len(last))
    positions, md = build_attention_metadata(query, context, tables, BLOCK_SIZE, p)
    staged = graphs.metadata(key)

    assert [int(graphs.dev_i64[ROW_IDS, r]) for r in rows_of] == ids
    assert [int(graphs.dev_i64[ROW_POSITIONS, r]) for r in rows_of] == positions.tolist()
    assert [int(staged.slot_mapping[r]) for r in rows_of] == md.slot_mapping.tolist()
    real = set(rows_of)
    padding = [r for r in range(tokens + rows) if r not in real]
    assert all(int(staged.slot_mapping[r]) == PAD_SLOT for r in padding)
    assert staged.cu_seqlens_q[: p + 1].tolist() == md.cu_seqlens_q[: p + 1].tolist()
    assert (staged.cu_seqlens_q[p + 1 :] == prefill_tokens).all()
    assert staged.context_lens[:p].tolist() == md.context_lens[:p].tolist()
    assert (staged.context_lens[p:S] == 0).all()
    assert staged.context_lens[S : S + n].tolist() == md.context_lens[p:].tolist()
    assert (staged.context_lens[S + n :] == 0).all()  # padding decodes read no keys
    for i, table in enumerate(tables):
        slot = i if i < p else S + i - p
        assert staged.block_tables[slot, : len(table)].tolist() == table
    assert staged.num_prefill_seqs == S and staged.num_prefill_tokens == tokens
    assert staged.num_decode_seqs == rows and staged.num_tokens == tokens + rows
    assert staged.slot_mapping.shape == (tokens + rows,)
    assert staged.block_tables.shape == (S + rows, TABLE_WIDTH)
    assert staged.context_lens.shape == (S + rows,)
    # The sampled rows, in the graph's numbering.
    hidden = torch.arange(tokens + rows, dtype=torch.float32)[:, None].repeat(1, 4)
    selected, temps = graphs.sampled(hidden, len(last))
    assert selected[:, 0].tolist() == [float(rows_of[r]) for r in last]
    assert temps.tolist() == [0.5] * len(last)


def test_longest_first_stages_the_decode_rows_by_context() -> None:
    # The decode kernel takes the mixed graph's decode rows in this order (padding rows, context
    # 0, last); without longest_first the metadata names no order.
    graphs = MixedGraphs(prefill_graph_sizes(1024), mixed_decode_sizes(32), TABLE_WIDTH,
                         BLOCK_SIZE, 4, torch.float32, torch.device("cpu"), longest_first=True)
    query, context = [3, 1, 1, 1], [3, 9, 20, 9]
    tables = [[0], [1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11]]
    key = graphs.key(3, 1, 3)
    assert key is not None
    graphs.stage([1] * 6, query, context, tables, 1, key)
    staged = graphs.metadata(key)
    assert staged.decode_order is not None
    assert staged.decode_order.tolist() == [1, 0, 2, *range(3, key[1])]  # within the decode part
    assert staged.context_lens[S : S + 3].tolist() == [9, 20, 9]
    assert _graphs().metadata(key).decode_order is None


def test_sampled_rows_past_the_prefill_part_move_to_the_decode_rows() -> None:
    assert graph_rows([2, 5, 6, 7], 6, 16) == [2, 5, 16, 17]


def test_a_mixed_graph_needs_sizes() -> None:
    with pytest.raises(ValueError, match="decode capacities"):
        MixedGraphs([16], [], TABLE_WIDTH, BLOCK_SIZE, 4, torch.float32, torch.device("cpu"))


@given(mixed_batches())
def test_the_eager_alignment_changes_no_row(batch) -> None:  # type: ignore[no-untyped-def]
    """Empty prefill sequences move the decode part to an aligned sequence index and change no
    token's position or slot, nor the decode part's metadata."""
    query, context, tables, p = batch
    q2, c2, t2, p2 = aligned_prefill_part(query, context, tables, p)
    assert p2 % PREFILL_SEQ_ALIGN == 0 and p <= p2 < p + PREFILL_SEQ_ALIGN
    pos, md = build_attention_metadata(query, context, tables, BLOCK_SIZE, p)
    pos2, md2 = build_attention_metadata(q2, c2, t2, BLOCK_SIZE, p2)
    assert pos2.tolist() == pos.tolist()
    assert md2.slot_mapping.tolist() == md.slot_mapping.tolist()
    assert md2.num_prefill_tokens == md.num_prefill_tokens
    assert md2.context_lens[p2:].tolist() == md.context_lens[p:].tolist()
    assert md2.has_cached_context == md.has_cached_context
    assert md2.max_seqlen_q == md.max_seqlen_q


def test_batches_without_decodes_are_not_padded() -> None:
    batch = ([3, 2], [3, 2], [[0], [1]], 2)
    assert aligned_prefill_part(*batch) == batch


@given(mixed_batches(), st.data())
def test_pending_decode_inputs_are_taken_from_the_previous_steps_tokens(batch, data) -> None:  # type: ignore[no-untyped-def]
    """A mixed step launched while the step before is in flight: its decode rows with a source
    get that step's sampled token on the device, every other row keeps its staged id, and no
    source staged by an earlier step (of another graph key) survives into this one."""
    query, context, tables, p = batch
    n = len(query) - p
    graphs = _graphs()
    previous = torch.arange(500, 540, dtype=torch.int64)  # the tokens the step before sampled
    # An earlier step of a small key leaves sources in rows this step's prefill part covers.
    graphs.stage([7] * 17, [16, 1], [16, 16], [[0], [1]], 1, (16, 32), sources=[3],
                 previous_tokens=previous)
    assert int(graphs.dev_i64[ROW_IDS, 16]) == 503
    total = sum(query)
    ids = data.draw(st.lists(st.integers(0, 400), min_size=total, max_size=total))
    sources = data.draw(st.lists(st.sampled_from([NO_SOURCE, *range(40)]), min_size=n,
                                 max_size=n))
    prefill_tokens = sum(query[:p])
    key = graphs.key(prefill_tokens, p, n)
    assert key is not None
    graphs.stage(ids, query, context, tables, p, key, sources=sources, previous_tokens=previous)
    rows_of = graph_rows(range(total), prefill_tokens, key[0])
    want = ids[:prefill_tokens] + [ids[prefill_tokens + j] if src == NO_SOURCE else 500 + src
                                   for j, src in enumerate(sources)]
    assert [int(graphs.dev_i64[ROW_IDS, r]) for r in rows_of] == want


def test_sources_need_the_previous_steps_tokens() -> None:
    with pytest.raises(ValueError, match="previous step"):
        _graphs().stage([1, 2], [1, 1], [1, 1], [[0], [1]], 1, (16, 32), sources=[0])
