"""The prefill attention's roofline (``LinearFit.prefill_longest_s``), fitted once for the kernel.

The prefill kernel runs a program per query tile, sequence and KV head, each reading the keys up
to its tile. Many new tokens make many programs, and attention takes its work over the whole GPU
(``prefill_attn_work`` times the class's slope); a few new tokens over a long cached prefix make
too few programs to fill it, and attention takes as long as its longest program, which reads the
whole context (``prefill_longest_tokens``). The cost per key of that program is a property of
the kernel, not of the step class: it is fitted on the class whose steps show it cleanest (a
CUDA-graph prefill: no launch floor), and every class that runs prefill attention uses it with
its own work slope.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from replay.whatif.cost.features import CLASSES
from replay.whatif.cost.linear import FEATURES, MIN_STEP_S, PREFILL_LONGEST, LinearFit
from replay.whatif.cost.lstsq import fit_linear

# The classes that run prefill attention; the roofline is fitted on the first of them that ran.
FITTED_ON = ("prefill_graph", "mixed_graph", "prefill", "mixed")
PREFILL_CLASSES = frozenset(FITTED_ON)
# Candidate slopes: the quantiles of what each latency-bound step implies (and none at all).
SLOPE_QUANTILES = tuple(q / 20 for q in range(1, 20))
REFITS = 3  # rounds of linear refit under a roofline slope (the work slope moves with it)


def _relative_error(fit: LinearFit, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(fit.predict(x) - y) / np.maximum(y, MIN_STEP_S)))


def _with_slope(fit: LinearFit, slope: float, x: np.ndarray, y: np.ndarray,
                names: tuple[str, ...], relative: bool = False) -> LinearFit:
    """``fit`` with roofline ``slope``, its linear part refitted: a step its longest program
    bounds pays ``slope`` per key instead of its work (so its work column is left out and its
    longest program's time taken off), the others their work; the split redone with the
    refitted work slope (``REFITS`` rounds). A fit with a launch floor keeps its linear part
    (the floor's knee was chosen with it). ``names``: the features to refit on (a slope the
    roofline's steps had pushed negative may come back). ``relative``: the linear part fitted by
    errors relative to each step's time, the criterion ``refit`` chooses the slope by
    (``CostOptions.relative_roofline``); else by plain least squares, which the longest steps
    dominate."""
    with_slope = replace(fit, prefill_longest_s=slope)
    if fit.floor or not slope:
        return with_slope
    at_work, at_longest = FEATURES.index("prefill_attn_work"), FEATURES.index(PREFILL_LONGEST)
    weights = 1.0 / np.maximum(y, MIN_STEP_S) if relative else None
    for _ in range(REFITS):
        bound = slope * x[:, at_longest] > with_slope.coef[at_work] * x[:, at_work]
        x_part, y_part = x.copy(), y.copy()
        x_part[bound, at_work] = 0.0
        y_part[bound] -= slope * x[bound, at_longest]
        with_slope = replace(fit_linear(x_part, y_part, names, weights),
                             prefill_longest_s=slope)
    return with_slope


def refit(fit: LinearFit, x: np.ndarray, y: np.ndarray,
          names: tuple[str, ...] | None = None, relative: bool = False) -> LinearFit:
    """``fit`` with the roofline slope (seconds per key of the longest prefill program) that
    best explains ``y`` (least mean relative error, the linear part refitted with each
    candidate); unchanged where no slope does better than none. Candidates: what each step
    implies if its longest program bound it, given the best fit so far (``REFITS`` rounds).
    ``names``: the features its linear part is refitted on (None: ``fit``'s); ``relative``: as
    ``_with_slope``'s."""
    longest = x[:, FEATURES.index(PREFILL_LONGEST)]
    at_work = FEATURES.index("prefill_attn_work")
    plain = replace(fit, prefill_longest_s=0.0)
    best, best_error = plain, _relative_error(plain, x, y)
    ok = longest > 0
    for _ in range(REFITS):
        linear = replace(best, prefill_longest_s=0.0)
        implied = (y[ok] - linear.linear(x[ok]) + best.coef[at_work] * x[ok, at_work]) / longest[ok]
        implied = implied[implied > 0]
        improved = False
        for slope in np.unique(np.quantile(implied, SLOPE_QUANTILES)) if len(implied) else ():
            candidate = _with_slope(fit, float(slope), x, y, names or fit.features, relative)
            error = _relative_error(candidate, x, y)
            if error < best_error - 1e-12:
                best, best_error, improved = candidate, error, True
        if not improved:
            break
    return best


def with_roofline(fits: dict[str, LinearFit], x: np.ndarray, y: np.ndarray,
                  classes: np.ndarray, relative: bool = False) -> dict[str, LinearFit]:
    """``fits`` with the roofline (``refit`` on the first of ``FITTED_ON`` that ran, whose
    refitted fit it keeps; ``relative``: as ``_with_slope``'s) and its slope in every other
    prefill class's fit."""
    for name in FITTED_ON:
        rows = classes == name
        if name in fits and rows.any():
            # Refitted on the candidate set the class's fit came from (some slopes dropped).
            names = next((f for f in CLASSES[name].feature_sets
                          if set(fits[name].features) <= set(f)), fits[name].features)
            fitted = refit(fits[name], x[rows], y[rows], names, relative)
            break
    else:
        return fits
    out = {other: replace(fit, prefill_longest_s=fitted.prefill_longest_s)
           if other in PREFILL_CLASSES else fit for other, fit in fits.items()}
    out[name] = fitted
    return out
