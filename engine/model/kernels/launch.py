"""Programmatic dependent launch (Hopper and later): how this process's Triton kernels launch.

With it on, each kernel is launched with the PDL attribute, so the GPU may schedule it while the
kernel before it in the stream is still finishing; the kernel's first act is ``gdc_wait`` (it
waits for that kernel's completion and memory flush before touching memory), then
``gdc_launch_dependents`` (its own successor may be scheduled). Only the launch gap between
kernels is overlapped: every load and store still follows the previous kernel's, so results are
identical. Set once per process from ``Config.programmatic_launch`` (like the BLAS library,
before any graph is captured); off on CPU, in the interpreter and before compute capability 9.

The kernel of a long prompt's eager prefill (``Config.long_prefill_kernel``) is set here the
same way, once per process (``long_prefill.long_prefill_route`` reads it).
"""

from __future__ import annotations

from typing import Any

_enabled = False
_long_prefill_kernel = "tma"


def set_programmatic_launch(enabled: bool, capability: tuple[int, int] | None) -> bool:
    """Launch kernels with PDL when ``enabled`` and the device (``capability``) has it;
    returns whether it is on."""
    global _enabled
    _enabled = bool(enabled and capability is not None and capability[0] >= 9)
    return _enabled


def programmatic_launch() -> bool:
    """Whether kernels launch with programmatic dependent launch."""
    return _enabled


def pdl_options() -> dict[str, Any]:
    """Keyword arguments of a kernel launch: the kernel's ``USE_GDC`` and, when on, Triton's
    ``launch_pdl``."""
    return {"USE_GDC": True, "launch_pdl": True} if _enabled else {"USE_GDC": False}


def set_long_prefill_kernel(kernel: str) -> None:
    """The kernel eager launches of long prompts take (``Config.long_prefill_kernel``)."""
    global _long_prefill_kernel
    _long_prefill_kernel = kernel


def long_prefill_kernel() -> str:
    """The kernel eager launches of long prompts take."""
    return _long_prefill_kernel
