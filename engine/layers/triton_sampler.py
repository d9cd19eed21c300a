"""Token sampling on the GPU in one pass over the logits (Triton, Gumbel-max).

``argmax(logits / T + G)`` with ``G`` standard Gumbel noise is a draw from ``softmax(logits /
T)``, so no softmax, no normalisation and no float32 copy of the logits are needed: one kernel
reads each bf16 logit once (256 x 151,936 logits: ~78 MB) and writes the best (value, index)
of each chunk of the vocabulary; a tiny argmax over chunks finishes. The noise costs more than
the reads: one Philox call serves four columns, and logs are base 2 (the fast hardware ones).
PyTorch's softmax-and-exponential route moves ~1 GB for the same batch. Rows with ``T == 0``
are greedy (no noise). The noise is Philox counter-based: the same ``seed`` gives the same
tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SAMPLE_BLOCK_V = 4096
SAMPLE_NUM_WARPS = 8
# u is drawn in [0, 1); keep -log(u) finite and positive so -log(-log(u)) never produces NaN.
# A tl.constexpr: the only kind of global a compiled kernel may read.
MIN_UNIFORM = tl.constexpr(1e-20)
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _quarter_best(row_ptr, cols, vocab, scale, gain, u):
    """Best (score, column) of one quarter chunk: score = logit * scale + gain * Gumbel."""
    ok = cols < vocab
    x = tl.load(row_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    # -log2(-log2 u) is a standard Gumbel draw scaled by 1/ln 2 (shifted by a constant), and
    # scale = log2(e) / T puts the logits on the same base-2 scale: the argmax is unchanged.
    noise = -tl.log2(-tl.log2(tl.maximum(u, MIN_UNIFORM)))
    score = tl.where(ok, x * scale + gain * noise, float("-inf"))
    best, idx = tl.max(score, 0, return_indices=True, return_indices_tie_break_left=True)
    return best, tl.min(cols, 0) + idx


@triton.jit
def _take_later(best, idx, cand, cand_idx):
    """Keep the earlier column on ties (columns are visited in increasing order)."""
    take = cand > best
    return tl.where(take, cand, best), tl.where(take, cand_idx, idx)


# Values that change from step to step must not trigger a recompile.
@triton.jit(do_not_specialize=["seed"])
def _sample_chunk_kernel(
    logits_ptr,
    temps_ptr,
    best_val_ptr,
    best_idx_ptr,
    seed,
    logits_stride,
    vocab,
    num_chunks,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    quarter: tl.constexpr = BLOCK_V // 4
    lanes = tl.arange(0, quarter)
    # One Philox call gives four uniforms: one per quarter of the chunk.
    u0, u1, u2, u3 = tl.rand4x(seed, (row * num_chunks + chunk) * quarter + lanes)
    temp = tl.load(temps_ptr + row)
    sampled = temp > 0
    scale = tl.where(sampled, LOG2E / tl.where(sampled, temp, 1.0), 1.0)
    gain = tl.where(sampled, 1.0, 0.0)  # greedy rows: the plain argmax
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    base = chunk * BLOCK_V + lanes
    best, idx = _quarter_best(row_ptr, base, vocab, scale, gain, u0)
    cand, cand_idx = _quarter_best(row_ptr, base + quarter, vocab, scale, gain, u1)
    best, idx = _take_later(best, idx, cand, cand_idx)
    cand, cand_idx = _quarter_best(row_ptr, base + 2 * quarter, vocab, scale, gain, u2)
    best, idx = _take_later(best, idx, cand, cand_idx)
    cand, cand_idx = _quarter_best(row_ptr, base + 3 * quarter, vocab, scale, gain, u3)
    best, idx = _take_later(best, idx, cand, cand_idx)
    out = row * num_chunks + chunk
    tl.store(best_val_ptr + out, best)
    tl.store(best_idx_ptr + out, idx)


def sample_tokens(
    logits: torch.Tensor, temperatures: torch.Tensor, seed: int, block_v: int = SAMPLE_BLOCK_V
) -> torch.Tensor:
    """One token id (int64) per row of ``logits`` ``[rows, vocab]``; ``temperatures`` float32."""
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if temperatures.shape != (rows,):
        raise ValueError(f"{rows} rows of logits but temperatures {tuple(temperatures.shape)}")
    chunks = triton.cdiv(vocab, block_v)
    best_val = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    best_idx = torch.empty(rows, chunks, dtype=torch.int32, device=logits.device)
    if rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    _sample_chunk_kernel[(rows, chunks)](
        logits,
        temperatures,
        best_val,
        best_idx,
        seed,
        logits.stride(0),
        vocab,
        chunks,
        BLOCK_V=block_v,
        num_warps=SAMPLE_NUM_WARPS,
    )
    winner = best_val.argmax(dim=1, keepdim=True)
    return best_idx.gather(1, winner).squeeze(1).to(torch.int64)
