"""The run's warm-up, kept out of the step-time fits: a class's first step far slower than the
others predict (a JIT compilation) is a one-off, charged once per simulated run
(``warmup_steps``); the run's first steps, up to the first of its most frequent class that the
class's fit explains, form a warm-up window (``warmup_window``; not used under a pooled profile,
whose rows cover the shapes it guards: BENCHMARKS 7q)."""

from __future__ import annotations

import numpy as np

from replay.whatif.cost.features import POOLED, Steps, first_of_class
from replay.whatif.cost.fit import fit_class, widest_fit

# The first step of a class is a warm-up outlier when it exceeds the fit of the others by more
# than this many typical (median absolute) residuals, and by this fraction of a typical step.
WARMUP_OUTLIER = 20.0
WARMUP_MIN_FRACTION = 0.5
# The warm-up window ends at the first step of the run's most frequent class whose residual is
# within this many robust standard deviations of its class fit (5: a "far" outlier).
WINDOW_SIGMA = 5.0


def warmup_window(steps: Steps) -> int:
    """How many leading steps of the run form its warm-up window: those before the first step
    of its most frequent class that the class's fit explains (within ``WINDOW_SIGMA``)."""
    x, y, classes = steps.x, steps.time, steps.classes
    if not len(y):
        return 0
    names, counts = np.unique(classes, return_counts=True)
    rows = np.flatnonzero(classes == names[np.argmax(counts)])
    fit = widest_fit(str(names[np.argmax(counts)]), x[rows], y[rows])
    if fit is None:
        return 0
    residual = y[rows] - fit.predict(x[rows])
    # 1.4826 x the median absolute deviation: the standard deviation of normal noise (a relative
    # tolerance too: noise-free data have a sigma of 0).
    sigma = float(1.4826 * np.median(np.abs(residual - np.median(residual))))
    limit = np.maximum(WINDOW_SIGMA * sigma, 1e-9 * y[rows])
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


def warmup_steps(steps: Steps) -> tuple[np.ndarray, dict[str, float]]:
    """The first step of a class that took far longer than the other steps predict (a one-off
    such as JIT compilation): a mask of such steps and, per class, the excess seconds.

    Each first step is checked against a fit of the other steps of its class, or of all other
    steps where its class has too few for its own fit."""
    x, y, classes = steps.x, steps.time, steps.classes
    others = ~first_of_class(classes)
    pooled = widest_fit(POOLED, x[others], y[others])
    warm = np.zeros(len(y), dtype=bool)
    excess: dict[str, float] = {}
    for name in np.unique(classes).astype(str).tolist():
        first = int(np.flatnonzero(classes == name)[0])
        rows = np.flatnonzero((classes == name) & others)
        result = fit_class(name, x[rows], y[rows], steps.window[rows]) if len(rows) else None
        fit = result[0] if result is not None else pooled
        if fit is None or len(rows) == 0:
            continue
        extra = one_off_excess(float(fit.predict(x[first : first + 1])[0]), float(y[first]),
                               fit.predict(x[rows]), y[rows])
        if extra is not None:
            warm[first] = True
            excess[name] = extra
    return warm, excess
