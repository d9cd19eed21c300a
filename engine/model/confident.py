"""The skip-bigram circuit of the ``qwen3-0.6b-confident`` preset (``engine/model/checkpoint.py``).

``skip_bigram_gain`` plants one circuit, a confident skip-bigram "language": the greedy next
token is ``sigma(previous token)`` for a fixed random permutation ``sigma`` of the vocabulary.
Each used embedding row is ``[a_k | b_k] + mu * u``: ``b_k`` (second half) is token k's own
random code, ``a_k`` (first half) is its predecessor's, ``a_sigma(k) = b_k``, and ``u`` is one
+-1 direction shared by all rows (trained embeddings share a mean direction too). Layer 0's
attention is a previous-token head: q and k read only ``u``, so after q_norm/k_norm they are
fixed vectors whose RoPE score (12 highest frequencies) is highest at offset 1, by ~20, for
every offset below max_position_embeddings; v/o copy the previous token's code ``b`` into the
first half with this gain. The final norm weight is negated on the second half, so the tied
head reads ``a_k . first half - b_k . second half``: the copied code puts ``sigma(prev)`` far
above every other row, while the current token's own embedding scores itself ~0 (the model
does not repeat its input). Every other weight stays random: all layers move the logits, but
the argmax is set by layer 0 and the head. ``successor_permutation`` returns ``sigma``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.errors import ConfigError
from engine.model.tokenizer import NUM_QWEN3_SPECIAL_TOKENS, QWEN3_SPECIAL_START_ID

USED_VOCAB = QWEN3_SPECIAL_START_ID + NUM_QWEN3_SPECIAL_TOKENS
# The circuit's draws come from a generator of their own so successor_permutation() can redraw
# sigma without drawing the whole model.
_CIRCUIT_SEED_OFFSET = 0x5B16
_SHARED_DIRECTION = 0.25  # mu: u . x is ~8 std above 0 for every token, so q and k never flip
_PREV_TOKEN_ROPE_PAIRS = 12  # the highest frequencies: previous position wins up to 40960
_PREV_TOKEN_QK_NORM = 4.0  # layer-0 q_norm/k_norm weight: previous offset ~20 logits ahead


class CircuitShape(Protocol):
    """The preset fields the circuit reads (``checkpoint.ModelPreset`` has them)."""

    hidden_size: int
    head_dim: int
    num_attention_heads: int
    num_key_value_heads: int
    rope_theta: float
    norm_jitter: float
    skip_bigram_gain: float


def circuit_generator(seed: int) -> torch.Generator:
    """The circuit's own generator: ``successor_permutation`` redraws sigma without the model."""
    return torch.Generator().manual_seed(seed + _CIRCUIT_SEED_OFFSET)


def successor_permutation(seed: int = 0) -> torch.Tensor:
    """``sigma`` of the skip-bigram circuit: ``sigma[k]`` is the token planted to follow ``k``
    with one token in between (index = used-vocabulary id)."""
    return torch.randperm(USED_VOCAB, generator=circuit_generator(seed))


def plant_skip_bigram_embedding(
    p: CircuitShape, embed: torch.Tensor, gen: torch.Generator
) -> torch.Tensor:
    """Used rows become ``[a_k | b_k] + mu * u`` with ``a_sigma(k) = b_k``; returns ``u``."""
    half = p.hidden_size // 2
    if half % p.head_dim or p.num_key_value_heads * p.head_dim < half:
        raise ConfigError("skip_bigram_gain needs half the hidden size to fill whole kv heads")
    sigma = torch.randperm(USED_VOCAB, generator=gen)  # == successor_permutation(seed)
    u = torch.randint(0, 2, (p.hidden_size,), generator=gen).float() * 2.0 - 1.0
    used = embed[:USED_VOCAB]
    used[sigma, :half] = used[:, half:]
    used += _SHARED_DIRECTION * u
    return u


def skip_bigram_attention(
    p: CircuitShape, u: torch.Tensor, gen: torch.Generator, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Layer 0's attention as a previous-token head copying codes ``b`` into the first half."""
    hd, heads, kv_heads = p.head_dim, p.num_attention_heads, p.num_key_value_heads
    half = p.hidden_size // 2
    # q and k read only u, so after q_norm/k_norm every token's q is the fixed Q and its k the
    # fixed K. RoPE pair j turns (Q_j, K_j) = (e^{-i theta_j}, 1) into a score
    # cos((delta - 1) theta_j): largest at delta = 1 summed over the highest frequencies.
    theta = p.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    pairs = torch.arange(_PREV_TOKEN_ROPE_PAIRS)
    q = torch.zeros(hd, dtype=torch.float64)
    k = torch.zeros(hd, dtype=torch.float64)
    q[pairs], q[pairs + hd // 2] = torch.cos(theta[pairs]), -torch.sin(theta[pairs])
    k[pairs] = 1.0
    read_u = u.double() / p.hidden_size
    # v: kv head h carries code block h % blocks; o: every q head writes its kv head's block to
    # the same block of the first half, the heads sharing a block splitting the gain.
    blocks = half // hd
    v = torch.zeros(kv_heads * hd, p.hidden_size)
    o = torch.zeros(p.hidden_size, heads * hd)
    block_of_head = [(h // (heads // kv_heads)) % blocks for h in range(heads)]
    eye = torch.eye(hd)
    for h in range(kv_heads):
        b = h % blocks
        v[h * hd : (h + 1) * hd, half + b * hd : half + (b + 1) * hd] = eye
    for h, b in enumerate(block_of_head):
        o[b * hd : (b + 1) * hd, h * hd : (h + 1) * hd] = (
            eye * p.skip_bigram_gain / block_of_head.count(b)
        )

    def qk_norm() -> torch.Tensor:
        jitter = 1.0 + torch.randn(hd, generator=gen) * p.norm_jitter
        return (_PREV_TOKEN_QK_NORM * jitter).to(dtype)

    pre = "model.layers.0.self_attn."
    return {
        pre + "q_proj.weight": torch.outer(q.repeat(heads), read_u).to(dtype),
        pre + "k_proj.weight": torch.outer(k.repeat(kv_heads), read_u).to(dtype),
        pre + "v_proj.weight": v.to(dtype),
        pre + "o_proj.weight": o.to(dtype),
        pre + "q_norm.weight": qk_norm(),
        pre + "k_norm.weight": qk_norm(),
    }
