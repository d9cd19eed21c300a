"""Fitting one step class of the step-time model: candidates, chosen by held-out error.

The physics the candidates follow:
- a step's time is linear in the work it does (weights read once per step: a constant; KV bytes
  read: ``decode_context_tokens``; per-sequence and per-token compute) when the GPU is the bound;
- a step that runs *eagerly* (no CUDA graph: eager prefill, mixed and eager-decode steps) has a
  launch-bound floor: below some size, it takes as long as launching its kernels takes, whatever
  its work. So an eager class is also fitted as ``max(floor, linear)``, the floor being the median
  of the steps below a knee (chosen by in-sample error), the linear part fitted above it;
- a CUDA-graph prefill (``prefill_graph``) computes its prompt tokens padded to a captured token
  count: its GEMMs run every padded row, so its time follows ``padded_tokens`` (plus attention
  over the real tokens and per-sequence sampling), and one graph launch has no launch floor.

Which candidate a class uses is decided by held-out error. A CUDA-graph decode class is scored
by extrapolation where it spans enough batch sizes: fitted on the steps up to half its largest
batch, scored on the larger ones (another config runs other batch sizes; a per-sequence slope
measured on small batches is what extrapolates worst). An eager class is scored on every
``HOLDOUT_EVERY``-th step: along its size it changes regime (floor, then compute), which a lower
half on the floor could not show. The candidate with the lowest held-out error wins, the simpler
one on a tie: a richer model must earn its parameters on steps it did not see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# Fixed order of the features in every coefficient vector.
FEATURES = (
    "num_seqs",
    "prefill_tokens",
    "prefill_attn_work",
    "decode_seqs",
    "decode_context_tokens",
    "padded_batch_size",
    # Tokens the forward computed: a CUDA-graph prefill's captured size, else the step's own
    # (prefill tokens + decode rows). Derived (``cost_steps``); appended last so that the other
    # features keep their positions.
    "padded_tokens",
)
# Candidate feature sets per class, simplest first.
FEATURE_SETS: dict[str, tuple[tuple[str, ...], ...]] = {
    "prefill": (
        ("prefill_tokens",),
        ("prefill_tokens", "prefill_attn_work"),
        ("prefill_tokens", "prefill_attn_work", "num_seqs"),
    ),
    "prefill_graph": (
        ("padded_tokens",),
        ("padded_tokens", "prefill_attn_work"),
        ("padded_tokens", "num_seqs"),
        ("padded_tokens", "prefill_attn_work", "num_seqs"),
    ),
    "decode_graph": (
        ("decode_context_tokens",),
        ("padded_batch_size", "decode_context_tokens"),
        ("decode_seqs", "decode_context_tokens"),
        ("padded_batch_size", "decode_seqs", "decode_context_tokens"),
    ),
    "decode_eager": (("decode_context_tokens",), ("decode_seqs", "decode_context_tokens")),
    "mixed": (
        ("prefill_tokens", "decode_context_tokens"),
        ("prefill_tokens", "prefill_attn_work", "decode_seqs", "decode_context_tokens"),
    ),
    "pooled": (
        (),
        ("prefill_tokens", "decode_context_tokens"),
        ("prefill_tokens", "prefill_attn_work", "decode_seqs", "decode_context_tokens"),
    ),
}
# Classes that run without a CUDA graph: each eager forward has a launch-bound floor.
EAGER_CLASSES = frozenset({"prefill", "mixed", "decode_eager"})
# The size a class is extrapolated along (and whose knee separates floor and compute regimes).
SIZE_FEATURE = {
    "prefill": "prefill_tokens",
    "prefill_graph": "padded_tokens",
    "mixed": "prefill_tokens",
    "decode_graph": "num_seqs",
    "decode_eager": "num_seqs",
    "pooled": "num_seqs",
}
# A class is fitted with k parameters only when it has this many samples per parameter.
SAMPLES_PER_PARAM = 4
HOLDOUT_EVERY = 5
# A floor is a size range over which time does not grow: only a class whose steps span at least
# this factor in size can show one (below it, floor candidates are not fitted).
FLOOR_MIN_RANGE = 2.0
# Knees tried between a floor and its compute regime: these quantiles of the class's size.
KNEE_QUANTILES = tuple(q / 10 for q in range(1, 10))
# Predictions never go below this (a step always takes some time; a fit may extrapolate to <= 0).
MIN_STEP_S = 1e-6


@dataclass
class LinearFit:
    """time = max(floor, intercept + coef . features) (coef over ``FEATURES``, zero for unused
    ones; floor 0: a plain linear fit)."""

    intercept: float
    coef: tuple[float, ...]
    features: tuple[str, ...]
    samples: int
    floor: float = 0.0

    def linear(self, x: np.ndarray) -> np.ndarray:
        return self.intercept + x @ np.asarray(self.coef)

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(self.linear(x), max(self.floor, MIN_STEP_S))

    def to_dict(self) -> dict[str, Any]:
        return {
            "intercept": self.intercept,
            "coef": dict(zip(FEATURES, self.coef)),
            "features": list(self.features),
            "samples": self.samples,
            "floor": self.floor,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LinearFit:
        return cls(
            float(data["intercept"]),
            tuple(float(data["coef"].get(name, 0.0)) for name in FEATURES),
            tuple(data["features"]),
            int(data["samples"]),
            float(data.get("floor", 0.0)),
        )


def fit_linear(x: np.ndarray, y: np.ndarray, names: tuple[str, ...],
               origin: bool = False) -> LinearFit:
    """Least squares with non-negative slopes: a feature whose slope comes out negative (noise,
    or collinearity with another) is dropped and the rest refitted, so extrapolating to larger
    batches than the trace saw never predicts *less* time for more work. A negative intercept
    (a step with no work taking negative time: the features barely vary, so the intercept is not
    identified) is refitted through the origin, as is everything with ``origin``."""
    active = list(names)
    while True:
        cols = [FEATURES.index(n) for n in active]
        if origin and not cols:
            origin = False  # nothing to scale: the mean
        scale = np.maximum(np.abs(x[:, cols]).max(axis=0), 1.0) if cols else np.ones(0)
        parts = [x[:, cols] / scale] if origin else [np.ones((len(y), 1)), x[:, cols] / scale]
        solution = np.linalg.lstsq(np.column_stack(parts), y, rcond=None)[0]
        intercept = 0.0 if origin else float(solution[0])
        slopes = solution[0 if origin else 1 :] / scale
        if (slopes < 0).any():
            active.pop(int(np.argmin(slopes)))
        elif intercept < 0:
            origin = True
        else:
            break
    coef = np.zeros(len(FEATURES))
    coef[[FEATURES.index(n) for n in active]] = slopes
    return LinearFit(intercept, tuple(coef.tolist()), tuple(active), len(y))


@dataclass(frozen=True)
class Candidate:
    """One model form for a class: linear in ``features``, or ``max(floor, that)``."""

    features: tuple[str, ...]
    floor: bool = False

    @property
    def params(self) -> int:
        """Fitted parameters: a floor, and an intercept plus a slope per feature for the linear
        part (a floor-only candidate has no linear part)."""
        linear = len(self.features) + 1 if self.features or not self.floor else 0
        return linear + int(self.floor)

    def label(self) -> str:
        feats = ", ".join(self.features) or "constant"
        if not self.floor:
            return feats
        return "floor only" if not self.features else f"max(floor, {feats})"


def candidates(name: str, eager: bool | None = None) -> list[Candidate]:
    """Simplest first (fewest parameters; a linear form before a floor of the same size)."""
    eager = name in EAGER_CLASSES if eager is None else eager
    out = [Candidate(f) for f in FEATURE_SETS[name]]
    if eager:
        out += [Candidate((), True)] + [Candidate(f, True) for f in FEATURE_SETS[name]]
    return sorted(out, key=lambda c: (c.params, c.floor))


def fit_candidate(cand: Candidate, x: np.ndarray, y: np.ndarray, size: int) -> LinearFit | None:
    """Fit one candidate (None: too few steps for it)."""
    n = len(y)
    if n < SAMPLES_PER_PARAM * cand.params or n == 0:
        return None
    if not cand.floor:
        return fit_linear(x, y, cand.features)
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
    test = np.zeros(len(s), dtype=bool)
    test[HOLDOUT_EVERY - 1 :: HOLDOUT_EVERY] = True
    return test, "interpolation"


def select(name: str, x: np.ndarray, y: np.ndarray,
           eager: bool | None = None) -> tuple[LinearFit | None, dict[str, Any]]:
    """The class's fit: each candidate scored on held-out steps, the best (the simpler on a tie)
    refitted on all steps. Also the scores (held-out MAPE %), for reporting."""
    size = FEATURES.index(SIZE_FEATURE[name])
    s = x[:, size]
    if eager is None:
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
        fit = fit_candidate(cand, x[~test], y[~test], size) if test.any() else None
        if fit is None:
            continue
        ape = np.abs(fit.predict(x[test]) - y[test]) / np.maximum(y[test], MIN_STEP_S)
        scores.append((cand, float(ape.mean())))
    if scores:
        # Rounded so that float noise between equivalent fits does not beat the simpler one.
        chosen = min(scores, key=lambda s: round(s[1], 9))[0]
    else:  # too few steps to hold any out: the richest candidate that fits
        chosen = [c for c in options if not c.floor][-1] if any(
            not c.floor for c in options) else options[-1]
    report = {
        "holdout": kind,
        "candidates": {c.label(): round(100 * m, 3) for c, m in scores},
        "chosen": chosen.label(),
    }
    return fit_candidate(chosen, x, y, size), report


def envelope(fit: LinearFit, name: str, x_window: np.ndarray, y_window: np.ndarray,
             steady_max: float) -> LinearFit | None:
    """A floor-only fit, extended beyond the steady steps' largest size by the warm-up-window
    steps larger than that: warm-up only adds time, so each bounds the cost from above, and
    the tightest bound (the least time per unit of size among them) is the compute slope.
    None: no window step lies beyond the steady range (or the fit is not floor-only)."""
    if fit.features or fit.floor <= 0:
        return None
    size = FEATURES.index(SIZE_FEATURE[name])
    s = x_window[:, size]
    beyond = s > steady_max
    if not beyond.any():
        return None
    slope = float(np.min(y_window[beyond] / s[beyond]))
    coef = np.zeros(len(FEATURES))
    coef[size] = slope
    return LinearFit(0.0, tuple(coef.tolist()), (SIZE_FEATURE[name],), fit.samples, fit.floor)


def surrogate(fit: LinearFit, x: np.ndarray) -> LinearFit:
    """A plain linear fit to a floored fit's predictions over the source's steps, for a caller
    that cannot apply a floor: close to the floored fit over the source's range."""
    if fit.floor <= 0 or len(x) == 0:
        return fit
    names = fit.features or ()
    return fit_linear(x, fit.predict(x), names)


def robust_sigma(residuals: np.ndarray) -> float:
    """1.4826 x the median absolute deviation: the standard deviation of normal noise."""
    if len(residuals) == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(residuals - np.median(residuals))))


def errors(predicted: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    safe = np.maximum(np.abs(actual), MIN_STEP_S)
    return {
        "n": int(len(actual)),
        "mape_pct": float(100 * np.mean(np.abs(predicted - actual) / safe)),
        "sum_error_pct": float(100 * (predicted.sum() - actual.sum()) / max(actual.sum(), 1e-12)),
    }
