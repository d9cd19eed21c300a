"""The prefill attention kernel at long contexts against PyTorch's SDPA, on the GPU.

One prompt of 1k to 32k new tokens, with and without a cached prefix (keys read fresh, and
through shuffled cache pages), in bf16 with the engine's default tiling (and, for fresh keys,
both the engine's choice and the flash SDPA route of ``LONG_FRESH_SDPA``): the
output must match SDPA's causal flash attention over the whole context within bf16 rounding,
and every output row must be written. Compiled kernels only: skipped without CUDA (the Triton
interpreter tests of ``test_triton_kernels.py`` cover the arithmetic at small sizes on the CPU).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CASES = [(1024, 0), (4096, 0), (8192, 0), (32768, 0), (1024, 3072), (2048, 14336),
         (4096, 28672)]


@pytest.mark.parametrize(("q_len", "cached"), CASES, ids=[f"{q}+{c}" for q, c in CASES])
def test_long_prefill_matches_sdpa(q_len: int, cached: int) -> None:
    from benchmarks.prefill_long import LONG_TOLERANCE, long_inputs, prefill_call, sdpa_reference

    inp = long_inputs(q_len, cached, seed=7)
    ref, _ = sdpa_reference(inp, q_len)
    # Fresh keys: the engine's choice and flash SDPA (``LONG_FRESH_SDPA``'s alternative).
    for paged, use_sdpa in ([(False, None), (False, True), (True, None)] if cached == 0
                            else [(True, None)]):
        out = torch.full_like(ref, float("nan"))
        prefill_call(inp, q_len, paged, out, use_sdpa)()
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), "every row must be written"
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        assert err < LONG_TOLERANCE, (paged, use_sdpa, err)
