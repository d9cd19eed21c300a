"""Decode staging buffers (the CUDA-graph inputs), checked on CPU against the plain formulas."""

from __future__ import annotations

import random

import torch

from engine.graph_sizes import decode_graph_sizes as graph_batch_sizes
from engine.model.attention_metadata import build_attention_metadata
from engine.runner.decode_graphs import DecodeBuffers
from engine.runner.graph_capture import PAD_SLOT

BLOCK_SIZE = 4
WIDTH = 8  # 32 tokens: the longest context below reaches 26


def stage(buffers: DecodeBuffers, seqs: list[dict], padded: int) -> None:
    buffers.stage(
        [s["id"] for s in seqs],
        [s["last"] for s in seqs],
        [s["ctx"] for s in seqs],
        [s["table"] for s in seqs],
        [s["temp"] for s in seqs],
        padded,
    )


def check(buffers: DecodeBuffers, seqs: list[dict], padded: int) -> None:
    n = len(seqs)
    positions, md = build_attention_metadata(
        [1] * n, [s["ctx"] for s in seqs], [s["table"] for s in seqs], BLOCK_SIZE, 0
    )
    assert torch.equal(buffers.input_ids[:n], torch.tensor([s["last"] for s in seqs]))
    assert torch.equal(buffers.positions[:n], positions)
    assert torch.equal(buffers.slot_mapping[:n], md.slot_mapping)
    assert torch.equal(buffers.context_lens[:n], md.context_lens)
    for i, s in enumerate(seqs):
        table = buffers.block_tables[i, : len(s["table"])]
        assert table.tolist() == s["table"]
    assert torch.equal(buffers.temperatures[:n], torch.tensor([s["temp"] for s in seqs]))
    assert (buffers.slot_mapping[n:padded] == PAD_SLOT).all()
    assert (buffers.context_lens[n:padded] == 0).all()


def test_graph_batch_sizes_follow_nano_vllm() -> None:
    assert graph_batch_sizes(512)[:6] == [1, 2, 4, 8, 16, 32]
    assert graph_batch_sizes(512)[-1] == 512 and len(graph_batch_sizes(512)) == 36
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16]


def test_stage_rows_tables_and_padding_over_many_steps() -> None:
    rng = random.Random(0)
    buffers = DecodeBuffers(16, WIDTH, BLOCK_SIZE, torch.device("cpu"))
    free = list(range(100))
    rng.shuffle(free)
    seqs = []
    for seq_id in range(10):
        ctx = rng.randint(1, 12)
        blocks = (ctx + BLOCK_SIZE - 1) // BLOCK_SIZE
        seqs.append(
            {"id": seq_id, "ctx": ctx, "last": rng.randrange(1000), "temp": 0.5,
             "table": [free.pop() for _ in range(blocks)]}
        )  # fmt: skip
    for step in range(14):
        padded = 16 if len(seqs) > 8 else 8
        stage(buffers, seqs, padded)
        check(buffers, seqs, padded)
        # Decode: every sequence grows by one token, appending a block when it needs one.
        for s in seqs:
            s["ctx"] += 1
            s["last"] = rng.randrange(1000)
            if s["ctx"] > len(s["table"]) * BLOCK_SIZE:
                s["table"].append(free.pop())
        if step == 4:
            seqs.pop(3)  # a sequence finished: later rows shift up
        if step == 8:
            seqs.reverse()
        if step == 10:
            # Preempted and re-prefilled: same id, same length, new blocks. The runner
            # invalidates after any prefill step; the next stage must rewrite the row.
            seqs[0]["table"] = [free.pop() for _ in seqs[0]["table"]]
            buffers.invalidate()


def test_longest_first_stages_rows_by_context_padding_last() -> None:
    # The decode kernel's programs take rows in this order (engine/model/kernels/
    # paged_attention.py): longest context first, ties in row order, padding rows at the end.
    buffers = DecodeBuffers(8, WIDTH, BLOCK_SIZE, torch.device("cpu"), longest_first=True)
    ctx = [5, 12, 5, 1, 12]
    seqs = [{"id": i, "last": 7, "ctx": c, "table": list(range(3 * i, 3 * i + 3)), "temp": 1.0}
            for i, c in enumerate(ctx)]
    stage(buffers, seqs, padded=8)
    md = buffers.metadata(8, max(ctx))
    assert md.decode_order is not None
    assert md.decode_order.tolist() == [1, 4, 0, 2, 3, 5, 6, 7]
    check(buffers, seqs, 8)
    # A smaller batch later: the order covers its own padded rows only.
    stage(buffers, seqs[:2], padded=2)
    assert buffers.metadata(2, 12).decode_order.tolist() == [1, 0]


def test_row_order_unless_longest_first() -> None:
    buffers = DecodeBuffers(4, WIDTH, BLOCK_SIZE, torch.device("cpu"))
    stage(buffers, [{"id": 0, "last": 1, "ctx": 3, "table": [0], "temp": 1.0}], padded=4)
    assert buffers.metadata(4, 3).decode_order is None


def test_eager_metadata_orders_decode_rows_longest_first() -> None:
    _, md = build_attention_metadata([4, 1, 1, 1], [4, 2, 9, 2], [[0], [1], [2, 3, 4], [5]],
                                     BLOCK_SIZE, 1, longest_first=True)
    assert md.decode_order is not None and md.decode_order.tolist() == [1, 0, 2]
    _, plain = build_attention_metadata([1, 1], [2, 3], [[0], [1]], BLOCK_SIZE, 0)
    assert plain.decode_order is None


def test_synthetic_steps_one_after_another_run_over_their_own_tables() -> None:
    """The profile's decodes, staged in the order it times them (each twice, as its repeats
    alternate the two host stages), hold each point's own block tables: its shared prefixes
    too. The buffers keep a row's table by sequence id, so synthetic ids must never repeat."""
    from engine.config import Config
    from engine.graph_sizes import padded_decode_size
    from engine.profiling import profile_grid

    config = Config(max_model_len=4096, max_num_seqs=32, max_num_batched_tokens=4096,
                    num_kvcache_blocks=4000)
    block = config.kvcache_block_size
    buffers = DecodeBuffers(32, -(-config.max_model_len // block), block, torch.device("cpu"))
    decodes = [p for p in profile_grid(config) if p.kind == "decode"]
    assert any(p.prefix_groups for p in decodes)
    sizes = graph_batch_sizes(32)
    for point in decodes:
        batch = point.batch(block)
        for _ in range(2):
            buffers.stage_sequences(batch.seqs, batch.context_lens,
                                    padded_decode_size(sizes, len(batch.seqs)),
                                    config.num_kvcache_blocks)
            staged = [buffers.block_tables[i, : len(table)].tolist()
                      for i, table in enumerate(point.block_tables(block))]
            assert staged == point.block_tables(block), point.label
