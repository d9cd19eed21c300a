"""CUDA-graph prefills: the captured sizes, the padding rule, and input staging.

The staged buffers must describe exactly the batch ``build_attention_metadata`` describes for
the eager path (positions, cache slots, query offsets, context lengths, block tables), with every
padding row inert (slot -1) and every padding sequence empty. The model run over them is checked
against the eager path in ``test_prefill_graphs_model.py`` (Triton) and on the GPU in
``test_gpu_runner.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine.graph_sizes import padded_prefill_tokens, prefill_graph_sizes
from engine.model.attention_metadata import build_attention_metadata
from engine.runner.graph_capture import PAD_SLOT, ROW_IDS, ROW_POSITIONS, ROW_SLOTS
from engine.runner.prefill_graphs import PrefillGraphs

BLOCK_SIZE = 16
TABLE_WIDTH = 8
SEQS = 16  # sequence slots of the graphs here


def test_sizes_double_up_to_1024_then_step_by_512() -> None:
    assert prefill_graph_sizes(4096) == [16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 2560,
                                         3072, 3584, 4096]
    assert prefill_graph_sizes(100) == [16, 32, 64]
    assert prefill_graph_sizes(1600) == [16, 32, 64, 128, 256, 512, 1024, 1536]
    assert prefill_graph_sizes(15) == []
    assert prefill_graph_sizes(0) == []


def test_a_graph_takes_no_more_prompts_than_its_largest_token_count_holds() -> None:
    from engine.config import Config
    from engine.graph_sizes import prefill_graph_prompts

    assert prefill_graph_prompts(Config()) == Config().prefill_graph_seqs
    assert prefill_graph_prompts(Config(prefill_graph_tokens=32, prefill_graph_seqs=64)) == 32
    assert prefill_graph_prompts(Config(prefill_graph_tokens=0)) == 0
    assert prefill_graph_prompts(Config(enforce_eager=True)) == 0


def test_padding_picks_the_smallest_size_that_holds_the_prefill() -> None:
    sizes = prefill_graph_sizes(4096)
    assert padded_prefill_tokens(sizes, 1, 1, 16) == 16
    assert padded_prefill_tokens(sizes, 16, 1, 16) == 16
    assert padded_prefill_tokens(sizes, 17, 2, 16) == 32
    assert padded_prefill_tokens(sizes, 1025, 3, 16) == 1536
    assert padded_prefill_tokens(sizes, 4096, 1, 16) == 4096
    assert padded_prefill_tokens(sizes, 4097, 1, 16) == 0  # too many tokens: eager
    assert padded_prefill_tokens(sizes, 100, 17, 16) == 0  # too many seqs
    assert padded_prefill_tokens([], 10, 1, 16) == 0


@st.composite
def prefill_batches(draw: st.DrawFn) -> tuple[list[int], list[int], list[list[int]]]:
    """Query and context lengths of a prefill batch (some with cached context) and tables."""
    num_seqs = draw(st.integers(1, 5))
    query, context, tables = [], [], []
    for _ in range(num_seqs):
        ctx = draw(st.integers(1, BLOCK_SIZE * TABLE_WIDTH))
        query.append(draw(st.integers(1, ctx)))
        context.append(ctx)
        blocks = -(-ctx // BLOCK_SIZE)
        tables.append(draw(st.lists(st.integers(0, 200), min_size=blocks, max_size=blocks)))
    return query, context, tables


@given(prefill_batches(), st.data())
def test_staged_buffers_match_the_eager_metadata(batch, data) -> None:  # type: ignore[no-untyped-def]
    query, context, tables = batch
    total = sum(query)
    sizes = prefill_graph_sizes(1024)
    padded = padded_prefill_tokens(sizes, total, len(query), SEQS)
    graphs = PrefillGraphs(sizes, TABLE_WIDTH, BLOCK_SIZE, 4, torch.float32, torch.device("cpu"),
                           SEQS)
    # Stale values from an earlier, larger step must not leak into this one.
    graphs.stage(list(range(100)), [100], [100], [list(range(TABLE_WIDTH))], 128)
    ids = data.draw(st.lists(st.integers(0, 1000), min_size=total, max_size=total))
    graphs.stage(ids, query, context, tables, padded)
    positions, md = build_attention_metadata(query, context, tables, BLOCK_SIZE, len(query))
    staged = graphs.metadata(padded)
    n, s = len(query), SEQS

    assert graphs.dev_i64[ROW_IDS, :total].tolist() == ids
    assert graphs.dev_i64[ROW_POSITIONS, :total].tolist() == positions.tolist()
    assert staged.slot_mapping[:total].tolist() == md.slot_mapping.tolist()
    assert (staged.slot_mapping[total:padded] == PAD_SLOT).all()
    assert (graphs.dev_i64[ROW_IDS, total:padded] == 0).all()
    assert staged.cu_seqlens_q[: n + 1].tolist() == md.cu_seqlens_q.tolist()
    assert (staged.cu_seqlens_q[n + 1 :] == total).all()  # padding sequences are empty
    assert staged.context_lens[:n].tolist() == md.context_lens.tolist()
    assert (staged.context_lens[n:] == 0).all()
    for row, table in enumerate(tables):
        assert staged.block_tables[row, : len(table)].tolist() == table
    assert staged.num_prefill_seqs == s and staged.num_prefill_tokens == padded
    # The tiling's bound: the longest prompt the block table holds, not the padded count.
    assert staged.max_seqlen_q == min(padded, TABLE_WIDTH * BLOCK_SIZE) and staged.paged_prefill
    assert staged.slot_mapping.shape == (padded,)
    assert staged.block_tables.shape == (s, TABLE_WIDTH)


def test_a_graph_needs_a_size() -> None:
    with pytest.raises(ValueError, match="token count"):
        PrefillGraphs([], TABLE_WIDTH, BLOCK_SIZE, 4, torch.float32, torch.device("cpu"), SEQS)


def test_staging_writes_positions_of_cached_context_sequences() -> None:
    # A prefix hit: 5 new tokens at positions 11..15 of a 16-token context.
    graphs = PrefillGraphs([16], TABLE_WIDTH, BLOCK_SIZE, 4, torch.float32, torch.device("cpu"),
                           SEQS)
    graphs.stage([1, 2, 3, 4, 5], [5], [16], [[7]], 16)
    assert graphs.dev_i64[ROW_POSITIONS, :5].tolist() == [11, 12, 13, 14, 15]
    assert graphs.dev_i64[ROW_SLOTS, :5].tolist() == [7 * 16 + p for p in range(11, 16)]
    assert np.all(graphs.dev_i64[ROW_SLOTS, 5:16].numpy() == PAD_SLOT)


def test_sample_rows_and_temperatures_are_staged_with_the_inputs() -> None:
    """The rows sampled (each sequence's last token) and their temperatures travel with the
    inputs, so nothing is copied from pageable memory after the replay."""
    graphs = PrefillGraphs([16], TABLE_WIDTH, BLOCK_SIZE, 4, torch.float32, torch.device("cpu"),
                           SEQS)
    graphs.stage([1, 2, 3, 4, 5], [2, 3], [2, 3], [[0], [1]], 16, [1, 4], [0.0, 0.7])
    hidden = torch.arange(16, dtype=torch.float32)[:, None].repeat(1, 4)
    selected, temps = graphs.sampled(hidden, 2)
    assert selected[:, 0].tolist() == [1.0, 4.0]
    assert temps.tolist() == [0.0, pytest.approx(0.7)]
    with pytest.raises(ValueError, match="temperature"):
        graphs.stage([1], [1], [1], [[0]], 16, [0], [])
