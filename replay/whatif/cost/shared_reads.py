"""Decode attention over shared prefixes: what the reads of a block several rows hold cost.

The paged decode kernel reads every row's KV blocks. A block that several decode rows of one
step hold (a shared prefix, as the prefix cache shares it) comes from HBM once; its other reads
may hit L2. So a decode's KV read is priced as its distinct tokens (``decode_kv_tokens``, a
shared block once) plus ``fraction`` of its re-reads (``decode_context_tokens`` less those):
``fraction`` 1 prices every read as one from memory, 0 prices the re-reads free
(``CostOptions.shared_kv``). It is a property of the kernel and the device, measured where a
fit has rows that share blocks (a device profile's decodes over shared prefixes,
engine/profiling.py level 2; a recording names no blocks per step, so its rows share none):
``fit.shared_read_fraction``. A fit of KV read so (``with_fraction``) is stated over the two
features (``split``), so that the simulator's count of each step's distinct blocks prices it
(``CostModel.shared_kv``: counted where the fraction is below 1).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from replay.whatif.cost.linear import FEATURES, LinearFit

# Fractions of a re-read's memory cost tried (1: no block read from L2).
FRACTIONS = tuple(step / 20 for step in range(21))
KV, CONTEXT = "decode_kv_tokens", "decode_context_tokens"
_KV_AT, _CONTEXT_AT = FEATURES.index(KV), FEATURES.index(CONTEXT)


def rereads(x: np.ndarray) -> np.ndarray:
    """Each step's KV tokens read again by another of its decode rows (a shared block's reads
    after its first)."""
    return x[:, _CONTEXT_AT] - x[:, _KV_AT]


def with_fraction(x: np.ndarray, fraction: float) -> np.ndarray:
    """``x`` with each step's KV read as its distinct tokens plus ``fraction`` of its re-reads
    (``x`` itself where no step re-reads a block, or ``fraction`` is 0)."""
    again = rereads(x)
    if fraction == 0.0 or not (again > 0).any():
        return x
    out = x.copy()
    out[:, _KV_AT] += fraction * again
    return out


def split(fit: LinearFit, fraction: float) -> LinearFit:
    """A fit of KV read as ``with_fraction`` over the distinct tokens (its slope times
    ``1 - fraction``) and every token read (times ``fraction``): the same prediction from the
    unmodified features. ``fraction`` 1 or 0 and a fit without a KV slope: as it is."""
    slope = fit.coef[_KV_AT]
    if not slope or fraction in (0.0, 1.0):
        return fit
    coef = list(fit.coef)
    coef[_KV_AT] = (1.0 - fraction) * slope
    coef[_CONTEXT_AT] += fraction * slope
    features = fit.features if CONTEXT in fit.features else (*fit.features, CONTEXT)
    return replace(fit, coef=tuple(coef), features=features)

