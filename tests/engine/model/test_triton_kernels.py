"""The Triton kernels against float64 PyTorch references, on fresh random inputs.

Without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors, tiny
shapes); without triton the whole module is skipped. Tests marked ``gpu`` use Qwen3-0.6B's
shapes and bf16 and need a CUDA device. Every output is poisoned with NaN first and every element
is checked, so an unwritten row fails.
"""

from __future__ import annotations

import pytest
import torch
from triton_env import HAS_CUDA, load_kernel_modules

kv_store, paged, prefill = load_kernel_modules(
    "engine.model.kernels.kv_store",
    "engine.model.kernels.paged_attention",
    "engine.model.kernels.prefill_attention",
)

DEVICE = "cuda" if HAS_CUDA else "cpu"
# Relative errors: float32 on the IEEE path is near rounding; bf16 operands a few 1e-3.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(out).any(), "NaN in output (an element was never written?)"
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def make_paged(
    gen: torch.Generator,
    context_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    spare_blocks: int = 3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random caches and block tables with pages shuffled (never contiguous by accident)."""
    needed = [(c + block_size - 1) // block_size for c in context_lens]
    num_blocks = sum(needed) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(max(needed, default=1), 1) + 1  # a spare column of padding, like real tables
    tables = torch.full((len(context_lens), width), -1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(needed):
        tables[i, :n] = torch.tensor(order[used : used + n], dtype=torch.int32)
        used += n
    return k_cache, v_cache, tables


def gather(cache: torch.Tensor, table: torch.Tensor, ctx: int) -> torch.Tensor:
    blocks = table[: (ctx + cache.shape[1] - 1) // cache.shape[1]].long()
    return cache[blocks].flatten(0, 1)[:ctx].double()


def attend_ref(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, offset: int, scale: float
) -> torch.Tensor:
    """float64 causal attention; query ``j`` sits at ``offset + j``; GQA by repetition."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys) * scale
    q_pos = torch.arange(q.shape[0])[:, None] + offset
    mask = torch.arange(keys.shape[0])[None, :] <= q_pos
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)


# --- KV store ----------------------------------------------------------------------------------


@pytest.mark.parametrize("num_kv_heads,head_dim", [(2, 16), (3, 8)])
def test_store_kv_writes_slots_and_skips_padding(num_kv_heads: int, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(num_kv_heads * 100 + head_dim)
    num_blocks, block_size, num_tokens = 6, 4, 9
    q_width = 2 * num_kv_heads * head_dim
    # k/v as strided views of a fused QKV row, the way the model produces them.
    fused = torch.randn(num_tokens, q_width + 2 * num_kv_heads * head_dim, generator=gen)
    k = fused[:, q_width : q_width + num_kv_heads * head_dim].view(-1, num_kv_heads, head_dim)
    v = fused[:, q_width + num_kv_heads * head_dim :].view(-1, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 5]] = -1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"))
    v_cache = torch.full(shape, float("nan"))
    k_cache, v_cache = _store_on_device(k, v, k_cache, v_cache, slots)
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    keep = slots >= 0
    assert torch.equal(flat_k[slots[keep]], k[keep])
    assert torch.equal(flat_v[slots[keep]], v[keep])
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots[keep]] = False
    assert torch.isnan(flat_k[untouched]).all() and torch.isnan(flat_v[untouched]).all()


def _store_on_device(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    kc, vc = k_cache.to(DEVICE), v_cache.to(DEVICE)
    kv_store.store_kv(k.to(DEVICE), v.to(DEVICE), kc, vc, slots.to(DEVICE))
    return kc.cpu(), vc.cpu()


# --- decode ------------------------------------------------------------------------------------


def check_decode(
    seed: int,
    context_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    num_splits: int | None,
    block_n: int = paged.DECODE_BLOCK_N,
) -> float:
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = make_paged(
        gen, context_lens, block_size, num_kv_heads, head_dim, dtype
    )
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=gen).to(dtype)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan")).to(DEVICE)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    paged.paged_decode_attention(
        q.to(DEVICE),
        k_cache.to(DEVICE),
        v_cache.to(DEVICE),
        tables.to(DEVICE),
        lens.to(DEVICE),
        scale,
        out=out,
        num_splits=num_splits,
        block_n=block_n,
    )
    out = out.cpu()
    refs = []
    for i, ctx in enumerate(context_lens):
        if ctx == 0:  # a padding row: zeros by contract
            refs.append(torch.zeros(1, num_heads, head_dim, dtype=torch.float64))
            continue
        keys, values = gather(k_cache, tables[i], ctx), gather(v_cache, tables[i], ctx)
        refs.append(attend_ref(q[i : i + 1], keys, values, ctx - 1, scale))
    ref = torch.cat(refs)
    for i, ctx in enumerate(context_lens):
        if ctx == 0:
            assert torch.equal(out[i], torch.zeros_like(out[i])), "padding row not zeroed"
    return rel_err(out, ref)


@pytest.mark.parametrize("num_splits", [1, 3, None])
@pytest.mark.parametrize("group", [1, 2])
def test_paged_decode_matches_reference(num_splits: int | None, group: int) -> None:
    # Lengths cover: a padding row (0), one key, a ragged last tile, several pages.
    lens = [37, 0, 1, 16, 70, 5]
    err = check_decode(7 + group, lens, 2 * group, 2, 16, 8, torch.float32, num_splits, 16)
    assert err < TOL[torch.float32]


def test_paged_decode_head_dim_not_power_of_two() -> None:
    err = check_decode(3, [9, 30], 4, 2, 24, 4, torch.float32, 2, 16)
    assert err < TOL[torch.float32]


def decode_outputs(seed: int, lens: list[int], dtype: torch.dtype, num_splits: int | None,
                   block_size: int = 8, heads: tuple[int, int, int] = (4, 2, 16),
                   head_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode launch in row order and one with the rows longest first (and, with
    ``head_major``, the caches stored ``[blocks, heads, block_size, dim]`` and read by strides)."""
    num_heads, num_kv_heads, head_dim = heads
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = make_paged(gen, lens, block_size, num_kv_heads, head_dim, dtype)
    q = torch.randn(len(lens), num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    ctx = torch.tensor(lens, dtype=torch.int32)
    order = torch.argsort(ctx, descending=True, stable=True).to(torch.int32)
    k_cache, v_cache = k_cache.to(DEVICE), v_cache.to(DEVICE)
    plain = torch.full_like(q, float("nan"))
    paged.paged_decode_attention(q, k_cache, v_cache, tables.to(DEVICE), ctx.to(DEVICE),
                                 head_dim**-0.5, out=plain, num_splits=num_splits)
    if head_major:
        k_cache = k_cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
        v_cache = v_cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    ordered = torch.full_like(q, float("nan"))
    paged.paged_decode_attention(q, k_cache, v_cache, tables.to(DEVICE), ctx.to(DEVICE),
                                 head_dim**-0.5, out=ordered, num_splits=num_splits,
                                 order=order.to(DEVICE))
    return plain.cpu(), ordered.cpu()


@pytest.mark.parametrize("num_splits", [1, 3])
def test_paged_decode_longest_first_gives_identical_outputs(num_splits: int) -> None:
    # The order only decides which program takes which row: every element must be the same bits,
    # padding rows (context 0, sorted last) still zero.
    plain, ordered = decode_outputs(5, [3, 0, 41, 9, 41, 17], torch.float32, num_splits)
    assert not torch.isnan(ordered).any()
    assert torch.equal(plain, ordered)


def test_paged_decode_reads_a_head_major_cache_by_its_strides() -> None:
    plain, strided = decode_outputs(6, [13, 30, 2], torch.float32, 2, head_major=True)
    assert torch.equal(plain, strided)


def test_paged_decode_refuses_an_order_of_the_wrong_length() -> None:
    q = torch.zeros(2, 2, 16)
    cache = torch.zeros(3, 4, 1, 16)
    with pytest.raises(ValueError, match="order has shape"):
        paged.paged_decode_attention(q, cache, cache, torch.zeros(2, 1, dtype=torch.int32),
                                     torch.ones(2, dtype=torch.int32), 1.0,
                                     order=torch.zeros(3, dtype=torch.int32))


@gpu
@needs_cuda
@pytest.mark.parametrize("num_splits", [1, 4])
def test_paged_decode_longest_first_identical_qwen3_shapes_bf16(num_splits: int) -> None:
    gen = torch.Generator().manual_seed(13)
    lens = torch.randint(1, 2100, (96,), generator=gen).tolist() + [0, 0, 256]
    plain, ordered = decode_outputs(14, lens, torch.bfloat16, num_splits, 256, (16, 8, 128))
    assert torch.equal(plain, ordered)


@gpu
@needs_cuda
@pytest.mark.parametrize("num_splits", [1, 2, 4, None])
def test_paged_decode_qwen3_shapes_bf16(num_splits: int | None) -> None:
    gen = torch.Generator().manual_seed(11)
    lens = torch.randint(1, 2100, (64,), generator=gen).tolist() + [0, 1, 255, 256, 257]
    err = check_decode(12, lens, 16, 8, 128, 256, torch.bfloat16, num_splits)
    assert err < TOL[torch.bfloat16]


# --- prefill -----------------------------------------------------------------------------------


def check_prefill(
    seed: int,
    query_lens: list[int],
    context_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    paged_kv: bool,
    **tiles: int | bool,
) -> float:
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = make_paged(
        gen, context_lens, block_size, num_kv_heads, head_dim, dtype
    )
    total = sum(query_lens)
    q = torch.randn(total, num_heads, head_dim, generator=gen).to(dtype)
    # Fresh k/v of the new tokens: the cache rows at their positions (the store already ran).
    k_rows, v_rows = [], []
    for i, (q_len, ctx) in enumerate(zip(query_lens, context_lens)):
        k_rows.append(gather(k_cache, tables[i], ctx)[ctx - q_len :].to(dtype))
        v_rows.append(gather(v_cache, tables[i], ctx)[ctx - q_len :].to(dtype))
    k, v = torch.cat(k_rows), torch.cat(v_rows)
    cu = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    out = torch.full_like(q, float("nan")).to(DEVICE)
    cache_args = (
        dict(
            k_cache=k_cache.to(DEVICE),
            v_cache=v_cache.to(DEVICE),
            block_tables=tables.to(DEVICE),
        )
        if paged_kv
        else {}
    )
    scale = head_dim**-0.5
    prefill.prefill_attention(
        q.to(DEVICE),
        k.to(DEVICE),
        v.to(DEVICE),
        cu.to(DEVICE),
        lens.to(DEVICE),
        max(query_lens),
        scale,
        out=out,
        **cache_args,
        **tiles,
    )
    refs = []
    for i, (q_len, ctx) in enumerate(zip(query_lens, context_lens)):
        keys, values = gather(k_cache, tables[i], ctx), gather(v_cache, tables[i], ctx)
        refs.append(attend_ref(q[cu[i] : cu[i + 1]], keys, values, ctx - q_len, scale))
    return rel_err(out.cpu(), torch.cat(refs))


@pytest.mark.parametrize("heavy_first", [True, False])
@pytest.mark.parametrize("group", [1, 2])
def test_prefill_with_cached_context_matches_reference(group: int, heavy_first: bool) -> None:
    # (query, context): a prefix hit of whole pages, a ragged hit, a single new token, no hit;
    # query tiles launched in either order (the longest prompt has tiles the others lack).
    query_lens, context_lens = [5, 19, 1, 23], [21, 30, 9, 23]
    err = check_prefill(
        group,
        query_lens,
        context_lens,
        2 * group,
        2,
        16,
        8,
        torch.float32,
        True,
        block_rows=16,
        block_n=16,
        heavy_first=heavy_first,
    )
    assert err < TOL[torch.float32]


@pytest.mark.parametrize("heavy_first", [True, False])
def test_prefill_flat_tiles_identical_to_the_sequence_grid(heavy_first: bool) -> None:
    # A CUDA graph's launch: six sequence slots (not a power of two), two of them empty (one
    # between live ones, one last), and padding rows after the live tokens. The flat grid must
    # write every live row exactly as the (tile, sequence, head) grid does, and no other row.
    query_lens, context_lens = [5, 0, 19, 1, 23, 0], [21, 0, 30, 9, 23, 0]
    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache, tables = make_paged(gen, context_lens, 2, 2, 16, torch.float32)
    total, padded = sum(query_lens), sum(query_lens) + 7
    q = torch.randn(padded, 4, 16, generator=gen)
    k, v = torch.randn(padded, 2, 16, generator=gen), torch.randn(padded, 2, 16, generator=gen)
    cu = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    args = [t.to(DEVICE) for t in (q, k, v, cu, torch.tensor(context_lens, dtype=torch.int32))]
    outs = []
    for flat in (False, True):
        out = torch.full_like(q, float("nan")).to(DEVICE)
        prefill.prefill_attention(
            *args, padded, 0.25, k_cache=k_cache.to(DEVICE), v_cache=v_cache.to(DEVICE),
            block_tables=tables.to(DEVICE), out=out, block_rows=8, block_n=16,
            heavy_first=heavy_first, flat_tiles=flat,
        )  # fmt: skip
        outs.append(out.cpu())
    assert torch.equal(outs[0][:total], outs[1][:total])
    assert not torch.isnan(outs[1][:total]).any()
    assert torch.isnan(outs[1][total:]).all()


def test_prefill_fresh_kv_matches_reference() -> None:
    lens = [17, 3, 33]
    err = check_prefill(5, lens, lens, 4, 2, 16, 8, torch.float32, False, block_rows=16, block_n=16)
    assert err < TOL[torch.float32]


@gpu
@needs_cuda
@pytest.mark.parametrize("paged_kv", [True, False])
def test_prefill_qwen3_shapes_bf16(paged_kv: bool) -> None:
    gen = torch.Generator().manual_seed(21)
    query_lens = torch.randint(1, 1100, (12,), generator=gen).tolist()
    if paged_kv:
        hits = torch.randint(0, 3, (12,), generator=gen).tolist()
        context_lens = [q + 256 * h for q, h in zip(query_lens, hits)]
    else:
        context_lens = list(query_lens)
    err = check_prefill(22, query_lens, context_lens, 16, 8, 128, 256, torch.bfloat16, paged_kv)
    assert err < TOL[torch.bfloat16]
