"""Layer units: tensor-parallel sharding done by hand with fake ranks, rotary, norm, sampler,
attention metadata and the PyTorch attention backend against a naive reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model.attention_metadata import build_attention_metadata
from engine.model.layers import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelGroup,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    Sampler,
    SiluAndMul,
    VocabParallelEmbedding,
)
from engine.model.layers.attention_torch import TorchAttentionBackend

TP = 2
HIDDEN = 8


class PartialRank(ParallelGroup):
    """One rank of a fake group whose collectives do nothing: tests combine ranks by hand."""

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def ranks() -> list[PartialRank]:
    return [PartialRank(rank=r, world_size=TP) for r in range(TP)]


@pytest.fixture()
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_column_parallel_concatenates_to_the_full_output(gen: torch.Generator) -> None:
    weight, bias = torch.randn(12, HIDDEN, generator=gen), torch.randn(12, generator=gen)
    x = torch.randn(3, HIDDEN, generator=gen)
    outs = []
    for group in ranks():
        layer = ColumnParallelLinear(HIDDEN, 12, bias=True, group=group)
        layer.weight.weight_loader(layer.weight, weight)
        layer.bias.weight_loader(layer.bias, bias)
        outs.append(layer(x))
    torch.testing.assert_close(torch.cat(outs, -1), F.linear(x, weight, bias))


def test_merged_gate_up_shards_each_part(gen: torch.Generator) -> None:
    gate, up = torch.randn(12, HIDDEN, generator=gen), torch.randn(12, HIDDEN, generator=gen)
    x = torch.randn(3, HIDDEN, generator=gen)
    outs = []
    for group in ranks():
        layer = MergedColumnParallelLinear(HIDDEN, [12, 12], group=group)
        layer.weight.weight_loader(layer.weight, gate, 0)
        layer.weight.weight_loader(layer.weight, up, 1)
        rows = slice(6 * group.rank, 6 * group.rank + 6)
        torch.testing.assert_close(layer.weight, torch.cat([gate[rows], up[rows]]))
        outs.append(SiluAndMul()(layer(x)))
    expected = F.silu(x @ gate.T) * (x @ up.T)
    torch.testing.assert_close(torch.cat(outs, -1), expected)


def test_qkv_shards_heads(gen: torch.Generator) -> None:
    head, heads, kv_heads = 4, 4, 2
    wq = torch.randn(heads * head, HIDDEN, generator=gen)
    wk = torch.randn(kv_heads * head, HIDDEN, generator=gen)
    wv = torch.randn(kv_heads * head, HIDDEN, generator=gen)
    for group in ranks():
        layer = QKVParallelLinear(HIDDEN, head, heads, kv_heads, group=group)
        for shard_id, w in (("q", wq), ("k", wk), ("v", wv)):
            layer.weight.weight_loader(layer.weight, w, shard_id)
        r = group.rank
        q_rows = slice(r * 2 * head, (r + 1) * 2 * head)  # two query heads per rank
        kv_rows = slice(r * head, (r + 1) * head)  # one KV head per rank
        expected = torch.cat([wq[q_rows], wk[kv_rows], wv[kv_rows]])
        torch.testing.assert_close(layer.weight, expected)
        assert (layer.num_heads, layer.num_kv_heads) == (2, 1)


def test_row_parallel_partial_sums_add_up(gen: torch.Generator) -> None:
    weight, bias = torch.randn(HIDDEN, 12, generator=gen), torch.randn(HIDDEN, generator=gen)
    x = torch.randn(3, 12, generator=gen)
    total = torch.zeros(3, HIDDEN)
    for group in ranks():
        layer = RowParallelLinear(12, HIDDEN, bias=True, group=group)
        layer.weight.weight_loader(layer.weight, weight)
        layer.bias.weight_loader(layer.bias, bias)
        total += layer(x[:, 6 * group.rank : 6 * group.rank + 6])
    torch.testing.assert_close(total, F.linear(x, weight, bias))  # bias counted once


def test_vocab_parallel_embedding_and_head(gen: torch.Generator) -> None:
    table = torch.randn(10, HIDDEN, generator=gen)
    ids = torch.tensor([0, 4, 5, 9, 5])
    hidden = torch.randn(2, HIDDEN, generator=gen)
    embedded = torch.zeros(len(ids), HIDDEN)
    logits = []
    for group in ranks():
        embed = VocabParallelEmbedding(10, HIDDEN, group=group)
        embed.weight.weight_loader(embed.weight, table)
        embedded += embed(ids)  # other ranks' ids come back as zeros
        head = ParallelLMHead(10, HIDDEN, group=group)
        head.tie_to(embed)
        logits.append(head(hidden))
    torch.testing.assert_close(embedded, table[ids])
    torch.testing.assert_close(torch.cat(logits, -1), hidden @ table.T)


def test_loaders_reject_wrong_shapes_and_uneven_shards() -> None:
    layer = ColumnParallelLinear(HIDDEN, 12, group=ranks()[1])
    with pytest.raises(ValueError, match=r"expected \(12, 8\), got \(10, 8\)"):
        layer.weight.weight_loader(layer.weight, torch.zeros(10, HIDDEN))
    with pytest.raises(ValueError, match="not divisible"):
        ColumnParallelLinear(HIDDEN, 7, group=ranks()[0])
    with pytest.raises(ValueError, match="shard id"):
        qkv = QKVParallelLinear(HIDDEN, 4, 2, 2)
        qkv.weight.weight_loader(qkv.weight, torch.zeros(8, HIDDEN), "x")
    with pytest.raises(ValueError, match="rank must be"):
        ParallelGroup(rank=2, world_size=2)


def test_rmsnorm_fused_residual(gen: torch.Generator) -> None:
    norm = RMSNorm(HIDDEN, eps=1e-6)
    norm.weight.data = torch.randn(HIDDEN, generator=gen)
    x, residual = torch.randn(4, HIDDEN, generator=gen), torch.randn(4, HIDDEN, generator=gen)
    out, new_residual = norm(x, residual)
    summed = x + residual
    torch.testing.assert_close(new_residual, summed)
    expected = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(out, expected)


def test_rotary_rotates_half_pairs_by_position(gen: torch.Generator) -> None:
    """Reference in complex numbers: pair (x[i], x[i + d/2]) turns by pos * theta^(-2i/d)."""
    head_dim, theta = 32, 1_000_000.0
    rope = RotaryEmbedding(head_dim, head_dim, 4096, theta)
    positions = torch.tensor([0, 1, 7, 100, 4095])
    q = torch.randn(5, 4, head_dim, generator=gen, dtype=torch.float64).float()
    k = torch.randn(5, 2, head_dim, generator=gen, dtype=torch.float64).float()
    ours_q, ours_k = rope(positions, q, k)
    half = head_dim // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / head_dim)
    turn = torch.polar(torch.ones(5, half, dtype=torch.float64), positions[:, None] * freq)

    def reference(x: torch.Tensor) -> torch.Tensor:
        z = torch.complex(x[..., :half].double(), x[..., half:].double()) * turn[:, None, :]
        return torch.cat([z.real, z.imag], -1).float()

    # float32 angles (as transformers computes them) drift ~1e-4 rad by position 4095; a layout
    # bug would be off by O(1).
    torch.testing.assert_close(ours_q, reference(q), atol=5e-4, rtol=0)
    torch.testing.assert_close(ours_k, reference(k), atol=5e-4, rtol=0)


def test_sampler_greedy_and_seeded(gen: torch.Generator) -> None:
    logits = torch.randn(4, 50, generator=gen)
    temps = [0.0, 1.0, 0.0, 0.7]
    first = Sampler(seed=3)(logits, temps)
    assert first[0] == logits[0].argmax() and first[2] == logits[2].argmax()
    assert torch.equal(first, Sampler(seed=3)(logits, temps))
    draws = torch.stack([Sampler(seed=s)(logits, temps) for s in range(20)])
    assert len(set(draws[:, 1].tolist())) > 1  # stochastic rows vary with the seed
    assert set(draws[:, 0].tolist()) == {int(logits[0].argmax())}


def test_sampler_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    tokens = Sampler(seed=0)(logits, [1.0] * 4000)
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03, rtol=0)


def test_slot_mapping_and_positions() -> None:
    # seq 0: prefill of 3 new tokens after 5 cached; seq 1: decode at position 4.
    positions, md = build_attention_metadata(
        query_lens=[3, 1],
        context_lens=[8, 5],
        block_tables=[[7, 2], [4, 9, 1]],
        block_size=4,
        num_prefill_seqs=1,
    )
    assert positions.tolist() == [5, 6, 7, 4]
    assert md.slot_mapping.tolist() == [2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 9 * 4 + 0]
    assert md.cu_seqlens_q.tolist() == [0, 3, 4] and md.cu_seqlens_k.tolist() == [0, 8, 13]
    assert md.block_tables.tolist() == [[7, 2, -1], [4, 9, 1]]
    assert (md.max_seqlen_q, md.max_seqlen_k, md.max_decode_seqlen_k) == (3, 8, 5)
    assert md.has_cached_context and md.num_tokens == 4
    with pytest.raises(ValueError, match="decode sequence 1 has 2 query tokens"):
        build_attention_metadata([3, 2], [8, 5], [[7, 2], [4, 9]], 4, 1)


def test_torch_attention_against_naive_reference(gen: torch.Generator) -> None:
    """A prefill after a cached prefix and two decodes, read back through shuffled blocks."""
    heads, kv_heads, dim, block = 4, 2, 8, 4
    contexts, queries = [7, 5, 9], [3, 1, 1]
    tables = [[5, 1], [3, 8], [0, 6, 2]]
    k_cache = torch.zeros(10, block, kv_heads, dim)
    v_cache = torch.zeros(10, block, kv_heads, dim)
    full_k = [torch.randn(n, kv_heads, dim, generator=gen) for n in contexts]
    full_v = [torch.randn(n, kv_heads, dim, generator=gen) for n in contexts]
    for table, ks, vs in zip(tables, full_k, full_v):  # the already-cached part
        for pos in range(len(ks)):
            k_cache[table[pos // block], pos % block] = ks[pos]
            v_cache[table[pos // block], pos % block] = vs[pos]
    _, md = build_attention_metadata(queries, contexts, tables, block, num_prefill_seqs=1)
    q = torch.randn(sum(queries), heads, dim, generator=gen)
    new_k = torch.cat([ks[c - n :] for ks, c, n in zip(full_k, contexts, queries)])
    new_v = torch.cat([vs[c - n :] for vs, c, n in zip(full_v, contexts, queries)])
    backend = TorchAttentionBackend()
    backend.store_kv(new_k, new_v, k_cache, v_cache, md.slot_mapping)
    out = backend.forward(q, new_k, new_v, k_cache, v_cache, md, scale=dim**-0.5)
    row = 0
    for ks, vs, ctx, n in zip(full_k, full_v, contexts, queries):
        for j in range(n):
            visible = ctx - n + j + 1
            keys = ks[:visible].repeat_interleave(heads // kv_heads, dim=1)
            values = vs[:visible].repeat_interleave(heads // kv_heads, dim=1)
            scores = torch.einsum("hd,khd->hk", q[row], keys) * dim**-0.5
            expected = torch.einsum("hk,khd->hd", scores.softmax(-1), values)
            torch.testing.assert_close(out[row], expected)
            row += 1
