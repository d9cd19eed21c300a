"""Which attention kernel an eager prefill launch of a long prompt takes, and the flash SDPA one.

The kernels (``ROUTES``): "tma" (the Hopper kernel of ``prefill_attention_tma.py``, where
``tma_prefill_fits``), "triton" (``prefill_attention``'s kernel with its long tilings) and
"flash_sdpa" (PyTorch's flash SDPA, one prompt with fresh keys; below). Which one a process
takes is ``Config.long_prefill_kernel`` (``launch.set_long_prefill_kernel``); CUDA-graph launches
and shorter prompts always take the Triton kernel. Figures: docs/BENCHMARKS.md 8a and 8k.
"""

from __future__ import annotations

import torch

from engine.config import LONG_PREFILL_KERNELS
from engine.model.kernels.launch import long_prefill_kernel

# Prompts of at least LONG_PREFILL_TOKENS new tokens (the longest in a launch) are long.
LONG_PREFILL_TOKENS = 8192
ROUTES = LONG_PREFILL_KERNELS


def long_prefill_route(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_seqs: int,
                       max_seqlen_q: int, k_cache: torch.Tensor | None,
                       v_cache: torch.Tensor | None, flat_tiles: bool) -> str:
    """The kernel this launch takes by default: the process's ``long_prefill_kernel()`` for an
    eager launch (never a CUDA graph's ``flat_tiles`` one) whose longest prompt has >=
    ``LONG_PREFILL_TOKENS`` new tokens, where that kernel can take it; "triton" otherwise."""
    route = long_prefill_kernel()
    if flat_tiles or max_seqlen_q < LONG_PREFILL_TOKENS or route == "triton":
        return "triton"
    if route == "tma":
        from engine.model.kernels.prefill_attention_tma import TMA_PAGED_TILING, tma_prefill_fits

        fits = tma_prefill_fits(q, k, v, k_cache, v_cache, block_n=TMA_PAGED_TILING[1])
        return "tma" if fits else "triton"
    sdpa_fits = (
        k_cache is None
        and num_seqs == 1
        and q.shape[0] == max_seqlen_q
        and q.is_cuda
        and q.dtype in (torch.bfloat16, torch.float16)
        and torch.backends.cuda.flash_sdp_enabled()
    )
    return "flash_sdpa" if sdpa_fits else "triton"


def flash_sdpa_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                       out: torch.Tensor) -> torch.Tensor:
    """Causal attention of one fresh prompt through PyTorch's flash SDPA (K/V heads repeated
    for the GQA groups), written into ``out``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    qb = q.transpose(0, 1)[None]
    kb = k.repeat_interleave(group, 1).transpose(0, 1)[None]
    vb = v.repeat_interleave(group, 1).transpose(0, 1)[None]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        res = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=True,
                                                               scale=scale)
    out.copy_(res[0].transpose(0, 1))
    return out
