"""Least squares with non-negative slopes: the one fitting rule of the step-time model
(``fit_linear`` for a class, ``fit_grouped`` for a constant per class and shared slopes).
Extrapolating never predicts less time for more work."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from replay.whatif.cost.linear import FEATURES, LinearFit


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
               weights: np.ndarray | None = None) -> LinearFit:
    """Least squares with non-negative slopes and intercept (``_nonnegative_lstsq``), each row
    weighted by ``weights`` (None: all 1)."""
    constant, slopes, active = _nonnegative_lstsq(x, y, names, np.ones((len(y), 1)), True,
                                                  weights)
    intercept = float(constant[0]) if len(constant) else 0.0
    return LinearFit(intercept, _coef(active, slopes), tuple(active), len(y))


def fit_grouped(x: np.ndarray, y: np.ndarray, classes: np.ndarray,
                names: tuple[str, ...]) -> dict[str, LinearFit]:
    """Least squares of a constant per class (never negative) plus slopes shared by all classes
    (non-negative: ``_nonnegative_lstsq``)."""
    present = sorted(set(classes.astype(str)))
    dummies = (classes.astype(str)[:, None] == np.array(present)[None, :]).astype(float)
    constants, slopes, active = _nonnegative_lstsq(x, y, names, dummies, False)
    coef = _coef(active, slopes)
    return {name: LinearFit(max(float(constants[i]), 0.0), coef, tuple(active),
                            int(dummies[:, i].sum()))
            for i, name in enumerate(present)}
