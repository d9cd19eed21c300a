"""The first statement of every engine kernel under programmatic dependent launch (launch.py)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gdc_enter(USE_GDC: tl.constexpr):
    """Under PDL (``USE_GDC``): wait for the kernel before this one to complete and flush, then
    let the next kernel be scheduled (it waits in its turn). Without: nothing."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the 128-byte lines at ``ptrs`` (kept there preferentially), without waiting
    or loading into registers. Before ``gdc_enter``: a kernel's weights, which no earlier kernel
    writes, come from HBM while the kernel before it finishes."""
    tl.inline_asm_elementwise(
        "mov.u32 $0, 0;\n\tprefetch.global.L2::evict_last [$1];",
        "=r,l",
        [ptrs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
