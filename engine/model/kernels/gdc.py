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
