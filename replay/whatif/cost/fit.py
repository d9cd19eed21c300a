"""Fitting the step-time model: per-class fits chosen by held-out error, warm-up, host time.

Each class's candidates (``ClassSpec.feature_sets``, simplest first) are linear in its features,
since a step's time is linear in its work when the GPU is the bound (weights read once per step: a
constant; KV read: ``decode_kv_tokens``; the longest attention program: ``decode_longest_tokens``;
per-sequence and per-token compute); an eager class (``ClassSpec.eager``) also tries ``max(floor,
linear)``, its launch-bound floor being the median of the steps below a knee. The candidate with
the lowest held-out error wins, the simpler on a tie: a richer model must earn its parameters on
steps it did not see. A CUDA-graph class is scored by extrapolation where it spans enough sizes (a
per-sequence slope measured on small batches is what extrapolates worst), an eager one on every
``HOLDOUT_EVERY``-th step (along its size it changes regime: floor, then compute).

The run's warm-up (a class's one-off first step, the leading window) is found by
``replay.whatif.cost.warmup``; window steps are left out of a class's fit where later steps cover
its range. Under a pooled profile each class's run steps weigh as much as its calibration and
profile rows (``weigh_run``): the profile gives the shape, the run the level where it has steps.
Host time (``fit_host``): a constant per class plus per-sequence and per-token costs shared by
every class (the same bookkeeping whatever the step, so a slope shown by decodes also prices a
mixed step the source never ran).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from replay.whatif.cost.features import (
    CLASSES,
    EAGER_CLASSES,
    FEATURES,
    MIN_STEP_S,
    POOLED,
    STEP_CLASSES,
    LinearFit,
    Steps,
    class_fit,
)
from replay.whatif.cost.lstsq import fit_grouped, fit_linear
from replay.whatif.cost.roofline import with_roofline
from replay.whatif.cost.shared_reads import FRACTIONS, rereads, split, with_fraction

SAMPLES_PER_PARAM = 4  # a class is fitted with k parameters only on at least 4k steps
HOLDOUT_EVERY = 5
# The classes whose projections take a route by their padded rows (``LinearFit.routes``): a CUDA
# graph's decode rows are its padded size.
ROUTED_CLASSES = ("decode_graph",)
# A floor is a size range over which time does not grow: only a class whose steps span at least
# this factor in size can show one (below it, floor candidates are not fitted).
FLOOR_MIN_RANGE = 2.0
KNEE_QUANTILES = tuple(q / 10 for q in range(1, 10))  # of a class's size: knees tried
# Under a pooled profile a class's run steps are repeated until, together, they weigh about as
# much as its calibration and profile rows (at most this many times): a source's few long
# prefills otherwise count for less than its start-up's many one-prompt ones.
RUN_WEIGHT_CAP = 16
# Host work grows with the sequences handled (block tables, sampling bookkeeping, events) and
# the prompt tokens staged: the shared slopes tried, simplest first.
HOST_FEATURE_SETS: tuple[tuple[str, ...], ...] = ((), ("num_seqs",), ("num_seqs", "prefill_tokens"))
# The token slope is each class's own where it has the rows for it (``lstsq.fit_grouped``'s
# ``own``): staging a graph prefill's tokens and launching an eager one's kernels per token
# are different work, and one shared slope lets the numerous eager rows price the other.
HOST_OWN = (("prefill_tokens",), 2 * SAMPLES_PER_PARAM)


def holdout_mask(classes: np.ndarray) -> np.ndarray:
    """The held-out steps: every HOLDOUT_EVERY-th step of each class."""
    test = np.zeros(len(classes), dtype=bool)
    for name in np.unique(classes):
        test[np.flatnonzero(classes == name)[HOLDOUT_EVERY - 1 :: HOLDOUT_EVERY]] = True
    return test


def errors(predicted: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    """Count, mean absolute percentage error and error of the sum (%)."""
    safe = np.maximum(np.abs(actual), MIN_STEP_S)
    return {
        "n": int(len(actual)),
        "mape_pct": float(100 * np.mean(np.abs(predicted - actual) / safe)),
        "sum_error_pct": float(100 * (predicted.sum() - actual.sum()) / max(actual.sum(), 1e-12)),
    }


def class_errors(predicted: np.ndarray, actual: np.ndarray,
                 classes: np.ndarray) -> dict[str, dict[str, float]]:
    """``errors`` of each step class present."""
    return {name: errors(predicted[classes == name], actual[classes == name])
            for name in STEP_CLASSES if (classes == name).any()}


# --- one class: candidates chosen by held-out error ----------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """One model form for a class: linear in ``features``, or ``max(floor, that)``."""

    features: tuple[str, ...]
    floor: bool = False

    @property
    def params(self) -> int:
        """A floor, and an intercept plus a slope per feature for a linear part (if any)."""
        linear = len(self.features) + 1 if self.features or not self.floor else 0
        return linear + int(self.floor)

    def label(self) -> str:
        feats = ", ".join(self.features) or "constant"
        if not self.floor:
            return feats
        return "floor only" if not self.features else f"max(floor, {feats})"


def candidates(name: str, eager: bool) -> list[Candidate]:
    """Simplest first (fewest parameters; a linear form before a floor of the same size)."""
    sets = CLASSES[name].feature_sets
    out = [Candidate(f) for f in sets]
    if eager:
        out += [Candidate((), True)] + [Candidate(f, True) for f in sets]
    return sorted(out, key=lambda c: (c.params, c.floor))


def fit_candidate(cand: Candidate, x: np.ndarray, y: np.ndarray, size: int,
                  routes: tuple[int, ...] = ()) -> LinearFit | None:
    """Fit one candidate (None: too few steps for it); ``routes``: as ``lstsq.fit_linear``'s."""
    n = len(y)
    if n < SAMPLES_PER_PARAM * cand.params or n == 0:
        return None
    if not cand.floor:
        return fit_linear(x, y, cand.features, routes=routes)
    if not cand.features:
        return LinearFit(0.0, (0.0,) * len(FEATURES), (), n, float(np.median(y)))
    best: tuple[float, LinearFit] | None = None
    s = x[:, size]
    for knee in np.unique(np.quantile(s, KNEE_QUANTILES)):
        below = s <= knee
        if below.sum() < SAMPLES_PER_PARAM or (~below).sum() < SAMPLES_PER_PARAM * (
            len(cand.features) + 1
        ):
            continue
        part = fit_linear(x[~below], y[~below], cand.features)
        fit = LinearFit(part.intercept, part.coef, part.features, n, float(np.median(y[below])))
        loss = float(np.abs(fit.predict(x) - y).mean())
        if best is None or loss < best[0]:
            best = (loss, fit)
    return None if best is None else best[1]


def holdout_split(s: np.ndarray, extrapolate: bool = True) -> tuple[np.ndarray, str]:
    """Test mask and its kind: the steps above half the largest size when both halves have
    enough steps ("extrapolation"), else every HOLDOUT_EVERY-th step ("interpolation")."""
    test = s > s.max() / 2 if len(s) and extrapolate else np.zeros(len(s), dtype=bool)
    need = SAMPLES_PER_PARAM * HOLDOUT_EVERY
    if test.sum() >= need and (~test).sum() >= need:
        return test, "extrapolation"
    return holdout_mask(np.zeros(len(s))), "interpolation"


def select(name: str, x: np.ndarray, y: np.ndarray, routes: tuple[int, ...] = ()
           ) -> tuple[LinearFit | None, dict[str, Any]]:
    """The class's fit: each candidate scored on held-out steps, the best (the simpler on a tie)
    refitted on all steps. Also the scores (held-out MAPE %), for reporting. ``routes``: every
    candidate's (``lstsq.fit_linear``)."""
    size = FEATURES.index(CLASSES[name].size_feature)
    s = x[:, size]
    eager = name in EAGER_CLASSES and len(s) > 0 and s.max() >= FLOOR_MIN_RANGE * max(
        s.min(), 1.0)
    options = [c for c in candidates(name, eager) if len(y) >= SAMPLES_PER_PARAM * c.params]
    if not options or len(y) == 0:
        return None, {}
    # An eager class changes regime along its size (floor, then compute): a lower half on the
    # floor cannot show the compute slope, so only graph classes are scored by extrapolation.
    test, kind = holdout_split(s, extrapolate=name not in EAGER_CLASSES)
    scores = []
    for cand in options:
        fit = fit_candidate(cand, x[~test], y[~test], size, routes) if test.any() else None
        if fit is None:
            continue
        ape = np.abs(fit.predict(x[test]) - y[test]) / np.maximum(y[test], MIN_STEP_S)
        scores.append((cand, float(ape.mean())))
    if scores:
        # Rounded so that float noise between equivalent fits does not beat the simpler one.
        chosen = min(scores, key=lambda s: round(s[1], 9))[0]
    else:  # too few steps to hold any out: the linear candidate with the most features
        linear = [c for c in options if not c.floor]
        chosen = linear[-1] if linear else options[-1]
    report = {
        "holdout": kind,
        "candidates": {c.label(): round(100 * m, 3) for c, m in scores},
        "chosen": chosen.label(),
    }
    return fit_candidate(chosen, x, y, size, routes), report


def widest_fit(name: str, x: np.ndarray, y: np.ndarray) -> LinearFit | None:
    """The linear fit on the most features the data supports (the pooled fit; quick checks)."""
    for names in sorted(CLASSES[name].feature_sets, key=len, reverse=True):
        if len(y) >= SAMPLES_PER_PARAM * (len(names) + 1):
            return fit_linear(x, y, names)
    return None


# --- every class, with the run's warm-up kept out -------------------------------------------------
def fit_class(name: str, x: np.ndarray, y: np.ndarray, window: np.ndarray,
              routes: tuple[int, ...] = ()) -> tuple[LinearFit, dict[str, Any]] | None:
    """One class's fit on its steps outside the warm-up window (on all of them where too few
    lie outside); ``routes``: as ``select``'s."""
    steady = ~window
    use = steady if steady.sum() >= SAMPLES_PER_PARAM * 2 else np.ones(len(y), dtype=bool)
    fit, report = select(name, x[use], y[use], routes)
    if fit is None:
        return None
    return fit, report


def fit_all(steps: Steps, roofline: bool = True, shared_reads: float = 1.0,
            relative_roofline: bool = False, routes: tuple[int, ...] = ()
            ) -> tuple[dict[str, LinearFit], dict[str, dict[str, Any]]]:
    """Each class's fit of ``steps.time`` where it has enough steps, and the pooled fit; per
    class also how its fit was chosen. ``roofline`` False: no prefill attention roofline
    (``roofline.with_roofline``; ``relative_roofline``: its linear part fitted by relative
    error). Steps whose decode rows re-read blocks another row reads too
    (a profile's shared prefixes) are left out: they measure only what such a re-read costs,
    ``shared_reads`` (a fraction of a read from memory: ``shared_read_fraction``), which the
    fits carry (``shared_reads.split``), so the steps that share nothing are priced as
    without them. ``routes``: the graph decodes' GEMM routes, each with a fixed cost of its own
    (``LinearFit.routes``; (): one for every size)."""
    steps = sharing_nothing(steps)
    fits: dict[str, LinearFit] = {}
    reports: dict[str, dict[str, Any]] = {}
    for name in STEP_CLASSES:
        mask = steps.classes == name
        result = (fit_class(name, steps.x[mask], steps.time[mask], steps.window[mask],
                            routes if name in ROUTED_CLASSES else ())
                  if mask.any() else None)
        if result is not None:
            fits[name], reports[name] = result
    if roofline:
        steady = ~steps.window
        fits = with_roofline(fits, steps.x[steady], steps.time[steady], steps.classes[steady],
                             relative_roofline)
    pooled = widest_fit(POOLED, steps.x, steps.time)
    if pooled is not None:
        fits[POOLED] = pooled
    return {name: split(fit, shared_reads) for name, fit in fits.items()}, reports


def sharing_nothing(steps: Steps) -> Steps:
    """``steps`` less those whose decode rows re-read blocks another row reads too (``steps``
    itself where none does)."""
    shared = rereads(steps.x) > 0
    return steps.rows(~shared) if shared.any() else steps


def shared_read_fraction(steps: Steps, roofline: bool = True,
                         relative_roofline: bool = False) -> float:
    """The fraction of a read from memory that a decode's re-read of a shared block costs
    (``fit_all``'s ``shared_reads``; L2 might serve some of them), measured within each shape:
    the steps that re-read blocks and are alike but for how much they share (a profile's
    shared-prefix rows of one batch and context, engine/profiling.py) show how their time moves
    with their re-reads, free of how the fits price the shape itself and of the device's state
    when the shape was timed. Of ``shared_reads.FRACTIONS``, the one with which the fits of the
    other steps predict each such step's time over its shape's mean best (least mean absolute
    error of that ratio; from 1 down, a lower one only where it does better). 1 where no two
    such steps of one shape differ in re-reads (a recording's never re-read: it names no blocks
    per step)."""
    again = np.flatnonzero(rereads(steps.x) > 0)
    alike: dict[tuple[str, tuple[float, ...]], list[int]] = {}
    for row, private in zip(again.tolist(), with_fraction(steps.x[again], 1.0).tolist()):
        alike.setdefault((str(steps.classes[row]), tuple(private)), []).append(row)
    groups = [rows for rows in alike.values()
              if len(set(rereads(steps.x[rows]).tolist())) > 1]
    if not groups:
        return 1.0
    fits, _ = fit_all(steps, roofline, relative_roofline=relative_roofline)
    if not fits:
        return 1.0
    best, best_error = 1.0, np.inf
    for fraction in sorted(FRACTIONS, reverse=True):
        error = []
        for rows in groups:
            fit = class_fit(fits, str(steps.classes[rows[0]]))
            predicted = fit.predict(with_fraction(steps.x[rows], fraction))
            measured = steps.time[rows]
            error.extend(np.abs(predicted / predicted.mean() - measured / measured.mean()))
        mean_error = float(np.mean(error))
        if mean_error < best_error - 1e-12:
            best, best_error = fraction, mean_error
    return best


def weigh_run(run: Steps, others: Steps, cap: int = RUN_WEIGHT_CAP) -> Steps:
    """``run`` with each class's steps repeated ``min(cap, others' rows of the class // run's)``
    times (once where they are as many as ``others``' or more): in a least-squares fit over
    ``run`` and ``others`` a class's run steps then weigh together about as much as its
    ``others`` rows (integer frequency weights)."""
    index = [np.arange(len(run))]
    for name in np.unique(run.classes).tolist():
        mine = np.flatnonzero(run.classes == name)
        repeats = min(cap, int((others.classes == name).sum()) // len(mine))
        index += [mine] * max(repeats - 1, 0)
    return run.rows(np.concatenate(index))


# --- host time ----------------------------------------------------------------------------------
def fit_host(steps: Steps) -> tuple[dict[str, LinearFit], dict[str, Any]]:
    """The host-time fits per class (``fit_grouped`` of ``steps.host``) on the steps outside the
    warm-up window (all of a class's steps where too few of its lie outside), the shared slopes
    chosen by held-out error (``holdout_mask``); and the scores."""
    use = ~steps.window
    for name in np.unique(steps.classes):
        rows = steps.classes == name
        if (rows & use).sum() < 2 * SAMPLES_PER_PARAM:
            use = use | rows
    x, host, classes = steps.x[use], steps.host[use], steps.classes[use]
    if not len(host):
        return {}, {}
    test = holdout_mask(classes)
    groups = len(np.unique(classes))
    options = [f for f in HOST_FEATURE_SETS if len(host) >= SAMPLES_PER_PARAM * (groups + len(f))]
    options = options or [()]
    scores: dict[tuple[str, ...], float] = {}
    if test.any() and (~test).any():
        for features in options:
            fits = fit_grouped(x[~test], host[~test], classes[~test], features, *HOST_OWN)
            if set(np.unique(classes[test])) <= set(fits):
                predicted = host_times(fits, x[test], classes[test])
                # Each class weighs alike: the shared slopes serve the few prefills too.
                per_class = class_errors(predicted, host[test], classes[test])
                scores[features] = float(np.mean([e["mape_pct"] / 100
                                                  for e in per_class.values()]))
    chosen = min(scores, key=lambda f: round(scores[f], 9)) if scores else options[-1]
    report = {"holdout": "interpolation",
              "candidates": {", ".join(f) or "constant": round(100 * m, 3)
                             for f, m in scores.items()},
              "chosen": ", ".join(chosen) or "constant"}
    return fit_grouped(x, host, classes, chosen, *HOST_OWN), report


def host_times(fits: dict[str, LinearFit], x: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Each step's host time by its class's fit (never negative)."""
    out = np.zeros(len(x))
    for name in np.unique(classes):
        mask = classes == name
        out[mask] = np.maximum(fits[str(name)].linear(x[mask]), 0.0)
    return out
