"""Least squares with non-negative slopes: the one fitting rule of the step-time model
(``fit_linear`` for a class, ``fit_grouped`` for a constant per class and shared slopes).
Extrapolating never predicts less time for more work."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from replay.whatif.cost.linear import FEATURES, LinearFit, route_columns

# A decode route (``LinearFit.routes``) gets its own fixed cost only where this many rows take it.
MIN_ROUTE_ROWS = 4


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray, names: Sequence[str], constants: np.ndarray,
                       keep_constant_positive: bool, weights: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Least squares of ``y`` on the ``constants`` columns and the ``names`` features, with
    non-negative slopes: a feature whose slope comes out negative (noise, collinearity) is dropped
    and the rest refitted, so extrapolating never predicts *less* time for more work.
    ``weights``: each row's weight in the squares (None: all 1).
    ``keep_constant_positive``: a negative constant (no work taking negative time: the features
    barely vary) is dropped too, the rest refitted through the origin. Returns the constants,
    slopes and features kept."""
    active = list(names)
    while True:
        cols = [FEATURES.index(n) for n in active]
        if not cols and constants.shape[1] == 0:
            constants = np.ones((len(y), 1))  # nothing to scale: the mean
        scale = np.maximum(np.abs(x[:, cols]).max(axis=0), 1.0) if cols else np.ones(0)
        k = constants.shape[1]
        design = np.column_stack([constants, x[:, cols] / scale])
        if weights is not None:
            design, target = design * weights[:, None], y * weights
        else:
            target = y
        solution = np.linalg.lstsq(design, target, rcond=None)[0]
        slopes = solution[k:] / scale
        if (slopes < 0).any():
            active.pop(int(np.argmin(slopes)))
        elif keep_constant_positive and k and solution[0] < 0:
            if not cols:  # nothing left to fit through the origin: no time at all
                return np.zeros(k), slopes, active
            constants = constants[:, :0]
        else:
            return solution[:k], slopes, active


def _coef(active: list[str], slopes: np.ndarray) -> tuple[float, ...]:
    coef = np.zeros(len(FEATURES))
    coef[[FEATURES.index(n) for n in active]] = slopes
    return tuple(coef.tolist())


def fit_linear(x: np.ndarray, y: np.ndarray, names: tuple[str, ...],
               weights: np.ndarray | None = None, routes: Sequence[int] = ()) -> LinearFit:
    """Least squares with non-negative slopes and intercept (``_nonnegative_lstsq``), each row
    weighted by ``weights`` (None: all 1). ``routes``: decode row bounds each taking a fixed
    cost of its own beyond the intercept (``LinearFit.routes``; of either sign), fitted with the
    slopes where ``MIN_ROUTE_ROWS`` rows take it and as many take the route above the last
    bound (which the intercept prices); 0 elsewhere."""
    taken = route_columns(x, routes) if routes else np.zeros((len(y), 0))
    fitted = [i for i in range(taken.shape[1]) if taken[:, i].sum() >= MIN_ROUTE_ROWS]
    if len(y) - taken.sum() < MIN_ROUTE_ROWS:
        fitted = []
    constants = np.column_stack([np.ones(len(y)), taken[:, fitted]])
    constant, slopes, active = _nonnegative_lstsq(x, y, names, constants, True, weights)
    intercept = float(constant[0]) if len(constant) else 0.0
    route_s = np.zeros(len(routes))
    if len(constant) > 1:
        route_s[fitted] = constant[1:]
    return LinearFit(intercept, _coef(active, slopes), tuple(active), len(y),
                     routes=tuple(routes), route_s=tuple(route_s.tolist()) if routes else ())


def fit_grouped(x: np.ndarray, y: np.ndarray, classes: np.ndarray,
                names: tuple[str, ...], own: tuple[str, ...] = (),
                own_min_rows: int = 0) -> dict[str, LinearFit]:
    """Least squares of a constant per class (never negative) plus slopes shared by all classes
    (non-negative: ``_nonnegative_lstsq``). ``own``: features (of ``names``) whose slope each
    class with at least ``own_min_rows`` rows fits for itself, in the same least squares (a
    slope of one class's physics: a graph prefill's host work per token is not an eager
    prefill's launches per token); the other classes share one. An own slope that comes out
    negative is given up: that class shares the slope again and the rest is refitted."""
    present = sorted(set(classes.astype(str)))
    dummies = (classes.astype(str)[:, None] == np.array(present)[None, :]).astype(float)
    own = tuple(n for n in own if n in names)
    owners = [i for i in range(len(present)) if own and dummies[:, i].sum() >= max(own_min_rows, 2)]
    while True:
        owned = dummies[:, owners].sum(axis=1) > 0 if owners else np.zeros(len(y), dtype=bool)
        shared_x = x.copy()
        for name in own:  # an owner's rows give the shared slope of an own feature nothing
            shared_x[owned, FEATURES.index(name)] = 0.0
        columns = [dummies[:, i] * x[:, FEATURES.index(name)] for i in owners for name in own]
        scales = [max(float(np.abs(c).max()), 1.0) for c in columns]
        extra = np.column_stack([dummies, *[c / s for c, s in zip(columns, scales)]])
        constants, slopes, active = _nonnegative_lstsq(shared_x, y, names, extra, False)
        own_slopes = np.asarray(constants[len(present):]) / np.asarray(scales, dtype=float)
        negative = [owners[k // len(own)] for k in np.flatnonzero(own_slopes < 0)]
        if not negative:
            break
        owners = [i for i in owners if i not in negative]
    shared = np.asarray(_coef(active, slopes))
    fits = {}
    for i, name in enumerate(present):
        coef = shared.copy()
        if i in owners:
            for j, feature in enumerate(own):
                coef[FEATURES.index(feature)] = own_slopes[owners.index(i) * len(own) + j]
        features = tuple(n for n in names if coef[FEATURES.index(n)] or n in active)
        fits[name] = LinearFit(max(float(constants[i]), 0.0), tuple(coef.tolist()), features,
                               int(dummies[:, i].sum()))
    return fits
