"""Fitting every step class of a trace, with the run's warm-up kept out of the fits.

Warm-up is handled twice. A first step of a class that took far longer than its class predicts
(a JIT compilation) is a one-off: kept out of the fit and charged once per simulated run
(``warmup_steps``). And the run's first steps, up to the first step of its most frequent class
that the class's fit explains, form a warm-up *window* (``warmup_window``): no class with a
reliable fit ran before it, so nothing shows those steps were not inflated. A class's steps in
the window are left out of its fit where later steps cover the same range, and bound the cost
from above where none do (``cost_fit.envelope``); a class seen only in the window is fitted on
those steps (there is nothing better).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replay.whatif.cost.fit import (
    FEATURE_SETS,
    FEATURES,
    SAMPLES_PER_PARAM,
    SIZE_FEATURE,
    LinearFit,
    envelope,
    fit_linear,
    robust_sigma,
    select,
)

# "prefill": an eager prefill; "prefill_graph": one run through a CUDA graph captured per padded
# token count (engine/runner/prefill_graphs.py).
STEP_CLASSES = ("prefill", "prefill_graph", "decode_graph", "decode_eager", "mixed")
# Reports align a column of class names (the pooled fallback's among them).
NAME_WIDTH = max(len(name) for name in (*STEP_CLASSES, "pooled"))
# The first step of a class is a warm-up outlier when it exceeds the fit of the others by more
# than this many typical (median absolute) residuals, and by this fraction of a typical step.
WARMUP_OUTLIER = 20.0
WARMUP_MIN_FRACTION = 0.5
# The warm-up window ends at the first step of the run's most frequent class whose residual is
# within this many robust standard deviations of its class fit (5: a "far" outlier).
WINDOW_SIGMA = 5.0


def richest(name: str, x: np.ndarray, y: np.ndarray) -> LinearFit | None:
    """The richest linear feature set the data supports (the pooled fallback; quick checks)."""
    for names in sorted(FEATURE_SETS[name], key=len, reverse=True):
        if len(y) >= SAMPLES_PER_PARAM * (len(names) + 1):
            return fit_linear(x, y, names)
    return None


def fit_class(name: str, x: np.ndarray, y: np.ndarray,
              window: np.ndarray) -> tuple[LinearFit, dict[str, Any]] | None:
    """One class's fit on its steps outside the warm-up window (on all of them where too few
    lie outside), extended by the window's steps beyond the steady range (``envelope``)."""
    steady = ~window
    enough = steady.sum() >= SAMPLES_PER_PARAM * 2
    use = steady if enough else np.ones(len(y), dtype=bool)
    fit, report = select(name, x[use], y[use])
    if fit is None:
        return None
    extended = None
    if enough and window.any():
        size = FEATURES.index(SIZE_FEATURE[name])
        extended = envelope(fit, name, x[window], y[window], float(x[steady, size].max()))
    report["envelope"] = extended is not None
    return extended or fit, report


def fit_all(x: np.ndarray, y: np.ndarray, classes: np.ndarray, window: np.ndarray
            ) -> tuple[dict[str, LinearFit], dict[str, dict[str, Any]]]:
    """Every class with enough steps (``window``: the steps in the warm-up window), and the
    pooled fallback; per class also how its fit was chosen."""
    fits: dict[str, LinearFit] = {}
    reports: dict[str, dict[str, Any]] = {}
    for name in STEP_CLASSES:
        mask = classes == name
        result = fit_class(name, x[mask], y[mask], window[mask]) if mask.any() else None
        if result is not None:
            fits[name], reports[name] = result
    # The fallback for a class without its own fit, perhaps one seen only in the window.
    pooled = richest("pooled", x, y)
    if pooled is not None:
        fits["pooled"] = pooled
    return fits, reports


def warmup_window(x: np.ndarray, y: np.ndarray, classes: np.ndarray) -> int:
    """How many leading steps of the run form its warm-up window: those before the first step
    of its most frequent class that the class's fit explains (within ``WINDOW_SIGMA``)."""
    if not len(y):
        return 0
    names, counts = np.unique(classes, return_counts=True)
    rows = np.flatnonzero(classes == names[np.argmax(counts)])
    fit = richest(str(names[np.argmax(counts)]), x[rows], y[rows])
    if fit is None:
        return 0
    residual = y[rows] - fit.predict(x[rows])
    # (A relative tolerance too: noise-free data have a robust sigma of 0.)
    limit = np.maximum(WINDOW_SIGMA * robust_sigma(residual), 1e-9 * y[rows])
    conforming = np.flatnonzero(residual <= limit)
    return int(rows[conforming[0]]) if len(conforming) else 0


def one_off_excess(first_predicted: float, first_measured: float, others_predicted: np.ndarray,
                   others_measured: np.ndarray) -> float | None:
    """The seconds a class's first step took beyond the fit of the class's other steps, when
    that makes it a one-off (over ``WARMUP_OUTLIER`` typical residuals and over
    ``WARMUP_MIN_FRACTION`` of a typical step); None when it is an ordinary step."""
    typical = float(np.median(np.abs(others_predicted - others_measured)))
    extra = float(first_measured - first_predicted)
    if extra > max(WARMUP_OUTLIER * typical,
                   WARMUP_MIN_FRACTION * float(np.median(others_measured))):
        return extra
    return None


def warmup_steps(
    x: np.ndarray, y: np.ndarray, classes: np.ndarray, window: np.ndarray
) -> tuple[np.ndarray, dict[str, float]]:
    """The first step of a class that took far longer than the other steps predict (a one-off
    such as JIT compilation): a mask of such steps and, per class, the excess seconds.

    Each first step is checked against a fit of the other steps of its class, or of all other
    steps where its class has too few for its own fit.
    """
    firsts = {name: int(np.flatnonzero(classes == name)[0]) for name in np.unique(classes)}
    others = np.ones(len(y), dtype=bool)
    others[list(firsts.values())] = False
    pooled = richest("pooled", x[others], y[others])
    warm = np.zeros(len(y), dtype=bool)
    excess: dict[str, float] = {}
    for name, first in firsts.items():
        rows = np.flatnonzero((classes == name) & others)
        result = fit_class(str(name), x[rows], y[rows], window[rows]) if len(rows) else None
        fit = result[0] if result is not None else pooled
        if fit is None or len(rows) == 0:
            continue
        extra = one_off_excess(float(fit.predict(x[first : first + 1])[0]), float(y[first]),
                               fit.predict(x[rows]), y[rows])
        if extra is not None:
            warm[first] = True
            excess[str(name)] = extra
    return warm, excess
