"""Overlap mode's host-time model (``replay.whatif.cost.overlap``): the engine's own CPU work per step.

One least-squares fit over all of a trace's steps of ``host_s``: a constant per step class (an
eager step launches its kernels, a CUDA-graph decode replays one graph) plus costs per sequence
and per prompt token shared by every class (the same bookkeeping per sequence whatever the step,
so a slope shown by decodes of many sizes also prices a mixed step the source never ran, or a
prefill batch of several prompts where the source's prefills had one each). Which of those slopes
it has is chosen by held-out error (every ``HOLDOUT_EVERY``-th step of each class), the simpler on
a tie; a slope that comes out negative is dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replay.whatif.cost.fit import FEATURES, HOLDOUT_EVERY, MIN_STEP_S, SAMPLES_PER_PARAM, LinearFit

# Host work grows with the sequences handled (block tables, sampling bookkeeping, events) and
# the prompt tokens staged: the shared slopes tried, simplest first.
HOST_FEATURE_SETS: tuple[tuple[str, ...], ...] = ((), ("num_seqs",), ("num_seqs", "prefill_tokens"))


def fit_joint(x: np.ndarray, y: np.ndarray, classes: np.ndarray,
              features: tuple[str, ...]) -> dict[str, LinearFit]:
    """Least squares of a constant per class plus slopes shared by all classes; a slope that
    comes out negative is dropped and the rest refitted (``cost_fit.fit_linear``'s rule)."""
    present = sorted(set(classes.astype(str)))
    dummies = (classes.astype(str)[:, None] == np.array(present)[None, :]).astype(float)
    active = list(features)
    while True:
        cols = [FEATURES.index(name) for name in active]
        scale = np.maximum(np.abs(x[:, cols]).max(axis=0), 1.0) if cols else np.ones(0)
        solution = np.linalg.lstsq(np.column_stack([dummies, x[:, cols] / scale]), y,
                                   rcond=None)[0]
        slopes = solution[len(present):] / scale
        if not (slopes < 0).any():
            break
        active.pop(int(np.argmin(slopes)))
    coef = np.zeros(len(FEATURES))
    coef[[FEATURES.index(name) for name in active]] = slopes
    return {name: LinearFit(max(float(solution[i]), 0.0), tuple(coef.tolist()), tuple(active),
                            int(dummies[:, i].sum()))
            for i, name in enumerate(present)}


def fit_host(x: np.ndarray, host: np.ndarray, classes: np.ndarray, window: np.ndarray
             ) -> tuple[dict[str, LinearFit], dict[str, Any]]:
    """The host-time fits per class (``fit_joint``) on the steps outside the warm-up window (all
    of a class's steps where too few of its lie outside), the shared slopes chosen by held-out
    error on every HOLDOUT_EVERY-th step; and the scores."""
    use = ~window
    for name in np.unique(classes):
        rows = classes == name
        if (rows & use).sum() < 2 * SAMPLES_PER_PARAM:
            use = use | rows
    x, host, classes = x[use], host[use], classes[use]
    if not len(host):
        return {}, {}
    test = np.zeros(len(host), dtype=bool)
    for name in np.unique(classes):
        test[np.flatnonzero(classes == name)[HOLDOUT_EVERY - 1 :: HOLDOUT_EVERY]] = True
    groups = len(np.unique(classes))
    options = [f for f in HOST_FEATURE_SETS if len(host) >= SAMPLES_PER_PARAM * (groups + len(f))]
    options = options or [()]
    scores: dict[tuple[str, ...], float] = {}
    if test.any() and (~test).any():
        for features in options:
            fits = fit_joint(x[~test], host[~test], classes[~test], features)
            if set(np.unique(classes[test])) <= set(fits):
                predicted = predict(fits, x[test], classes[test])
                ape = np.abs(predicted - host[test]) / np.maximum(host[test], MIN_STEP_S)
                scores[features] = float(ape.mean())
    chosen = min(scores, key=lambda f: round(scores[f], 9)) if scores else options[-1]
    report = {"holdout": "interpolation",
              "candidates": {", ".join(f) or "constant": round(100 * m, 3)
                             for f, m in scores.items()},
              "chosen": ", ".join(chosen) or "constant"}
    return fit_joint(x, host, classes, chosen), report


def predict(fits: dict[str, LinearFit], x: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Each step's host time by its class's fit (never negative)."""
    out = np.zeros(len(x))
    for name in np.unique(classes):
        mask = classes == name
        out[mask] = np.maximum(fits[str(name)].linear(x[mask]), 0.0)
    return out
