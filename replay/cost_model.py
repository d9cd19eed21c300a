"""The step-time model: how long one engine step takes, from the batch features it records.

Fitted by least squares on a trace's ``model_step`` rows, separately per step class (prefill,
decode with a CUDA graph, eager decode, mixed). The target is the step's *interval*: the wall
time from the end of the previous step (or the latest arrival, after an idle gap) to the end of
this one. That is what a run's makespan is the sum of: device time plus the engine's own CPU work
between steps (scheduling, input preparation, recording), which a device-only duration misses.

Every fit also reports its error on held-out steps (every ``HOLDOUT_EVERY``-th step of a class,
fitted on the others), so a prediction comes with how well the model explains steps it did not
see. ``CostModel.save``/``load`` keep a fit as JSON for ``--timing-from``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ReplayLLMError
from replay.metrics import has_timings
from replay.recorded import RecordedEvents

MODEL_VERSION = 1
# Fixed order of the features in every coefficient vector.
FEATURES = (
    "num_seqs",
    "prefill_tokens",
    "prefill_attn_work",
    "decode_seqs",
    "decode_context_tokens",
    "padded_batch_size",
)
# Candidate feature sets per class, richest first; the richest one the data supports is used.
FEATURE_SETS: dict[str, tuple[tuple[str, ...], ...]] = {
    "prefill": (
        ("prefill_tokens", "prefill_attn_work", "num_seqs"),
        ("prefill_tokens", "prefill_attn_work"),
        ("prefill_tokens",),
    ),
    "decode_graph": (
        ("padded_batch_size", "decode_seqs", "decode_context_tokens"),
        ("padded_batch_size", "decode_context_tokens"),
        ("decode_context_tokens",),
    ),
    "decode_eager": (("decode_seqs", "decode_context_tokens"), ("decode_context_tokens",)),
    "mixed": (
        ("prefill_tokens", "prefill_attn_work", "decode_seqs", "decode_context_tokens"),
        ("prefill_tokens", "decode_context_tokens"),
    ),
    "pooled": (
        ("prefill_tokens", "prefill_attn_work", "decode_seqs", "decode_context_tokens"),
        ("prefill_tokens", "decode_context_tokens"),
        (),
    ),
}
STEP_CLASSES = ("prefill", "decode_graph", "decode_eager", "mixed")
# A class is fitted with k features only when it has this many samples per parameter.
SAMPLES_PER_PARAM = 4
HOLDOUT_EVERY = 5
# The first step of a class is a warm-up outlier when it exceeds the fit of the others by more
# than this many typical (median absolute) residuals, and by this fraction of a typical step.
WARMUP_OUTLIER = 20.0
WARMUP_MIN_FRACTION = 0.5
# Predictions never go below this (a step always takes some time; a fit may extrapolate to <= 0).
MIN_STEP_S = 1e-6
# Nano-vLLM's CUDA-graph batch sizes: 1, 2, 4, 8, then every 16 up to 512; larger runs eager.
NANO_GRAPH_SMALL = (1, 2, 4, 8)
NANO_GRAPH_STRIDE = 16
NANO_GRAPH_MAX = 512


class CostModelError(ReplayLLMError):
    """A step-time model cannot be fitted or loaded."""


def step_class(kind: str, graph_used: bool) -> str:
    if kind == "decode":
        return "decode_graph" if graph_used else "decode_eager"
    return kind


def step_intervals(events: RecordedEvents) -> np.ndarray:
    """Wall seconds each step took, from the later of the previous step's end and the latest
    arrival added before it (so an idle gap waiting for requests is not counted)."""
    ms = events.tables["model_step"]
    steps = np.asarray(ms["step"], dtype=np.int64)
    end = np.asarray(ms["wall_time_s"], dtype=float)
    latest = np.full(len(steps), -np.inf)
    ra = events.tables["request_added"]
    if len(steps) and len(ra["step"]):
        rows = np.searchsorted(steps, np.asarray(ra["step"], dtype=np.int64))
        ok = rows < len(steps)
        np.maximum.at(latest, rows[ok], np.asarray(ra["arrival_s"], dtype=float)[ok])
    previous = np.concatenate([[-np.inf], end[:-1]])
    interval = end - np.maximum(previous, latest)
    bad = ~np.isfinite(interval) | (interval <= 0)
    interval[bad] = np.asarray(ms["duration_s"], dtype=float)[bad]
    return interval


def feature_matrix(events: RecordedEvents) -> tuple[np.ndarray, np.ndarray]:
    """(n_steps x len(FEATURES)) float matrix, and the class name of each step."""
    ms = events.tables["model_step"]
    x = np.column_stack([np.asarray(ms[name], dtype=float) for name in FEATURES])
    kinds = np.asarray(ms["kind"]).astype(str)
    graph = np.asarray(ms["graph_used"], dtype=bool)
    classes = np.where(kinds == "decode", np.where(graph, "decode_graph", "decode_eager"), kinds)
    return x.reshape(len(kinds), len(FEATURES)), classes


@dataclass
class LinearFit:
    """time = intercept + coef . features (coef over ``FEATURES``, zero for unused ones)."""

    intercept: float
    coef: tuple[float, ...]
    features: tuple[str, ...]
    samples: int

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(self.intercept + x @ np.asarray(self.coef), MIN_STEP_S)

    def to_dict(self) -> dict[str, Any]:
        return {
            "intercept": self.intercept,
            "coef": dict(zip(FEATURES, self.coef)),
            "features": list(self.features),
            "samples": self.samples,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LinearFit:
        return cls(
            float(data["intercept"]),
            tuple(float(data["coef"].get(name, 0.0)) for name in FEATURES),
            tuple(data["features"]),
            int(data["samples"]),
        )


def fit_linear(x: np.ndarray, y: np.ndarray, names: tuple[str, ...]) -> LinearFit:
    """Least squares with non-negative slopes: a feature whose slope comes out negative (noise,
    or collinearity with another) is dropped and the rest refitted, so extrapolating to larger
    batches than the trace saw never predicts *less* time for more work."""
    active = list(names)
    while True:
        cols = [FEATURES.index(n) for n in active]
        scale = np.maximum(np.abs(x[:, cols]).max(axis=0), 1.0) if cols else np.ones(0)
        design = np.column_stack([np.ones(len(y)), x[:, cols] / scale])
        solution = np.linalg.lstsq(design, y, rcond=None)[0]
        slopes = solution[1:] / scale
        if (slopes >= 0).all():
            break
        active.pop(int(np.argmin(slopes)))
    coef = np.zeros(len(FEATURES))
    coef[[FEATURES.index(n) for n in active]] = slopes
    return LinearFit(float(solution[0]), tuple(coef.tolist()), tuple(active), len(y))


def _fit_class(name: str, x: np.ndarray, y: np.ndarray) -> LinearFit | None:
    for names in FEATURE_SETS[name]:
        if len(y) >= SAMPLES_PER_PARAM * (len(names) + 1):
            return fit_linear(x, y, names)
    return None


def _fit_all(x: np.ndarray, y: np.ndarray, classes: np.ndarray) -> dict[str, LinearFit]:
    fits: dict[str, LinearFit] = {}
    for name in STEP_CLASSES:
        mask = classes == name
        fit = _fit_class(name, x[mask], y[mask])
        if fit is not None:
            fits[name] = fit
    pooled = _fit_class("pooled", x, y)
    if pooled is not None:
        fits["pooled"] = pooled
    return fits


@dataclass
class CostModel:
    """Per-class linear fits plus how the source run padded decode batches for CUDA graphs."""

    fits: dict[str, LinearFit]
    source: str = ""
    heldout: dict[str, Any] = field(default_factory=dict)
    graph_sizes: list[int] = field(default_factory=list)  # empty: the source ran no graphs
    # Class -> seconds the first step of that class took beyond the fit (JIT compilation,
    # lazy allocation): charged once per run, kept out of the per-step fit.
    warmup_s: dict[str, float] = field(default_factory=dict)

    # --- fitting --------------------------------------------------------------------------------
    @classmethod
    def fit(cls, events: RecordedEvents, source: str = "") -> CostModel:
        """Fit from a recording with measured step times; held-out error in ``heldout``."""
        if not has_timings(events):
            raise CostModelError(
                f"{source or 'the trace'} has no measured step times (recorded without a model)"
            )
        x, classes = feature_matrix(events)
        y = step_intervals(events)
        warm, warmup_s = _warmup_steps(x, y, classes)
        fits = _fit_all(x[~warm], y[~warm], classes[~warm])
        if not fits:
            raise CostModelError(f"{source or 'the trace'} has too few steps to fit a model")
        model = cls(fits, source=source, graph_sizes=_observed_graph_sizes(events),
                    warmup_s=warmup_s)
        model.heldout = model._evaluate(x[~warm], y[~warm], classes[~warm])
        return model

    def _evaluate(self, x: np.ndarray, y: np.ndarray, classes: np.ndarray) -> dict[str, Any]:
        """Refit without every HOLDOUT_EVERY-th step of each class; error on those steps."""
        test = np.zeros(len(y), dtype=bool)
        for name in STEP_CLASSES:
            rows = np.flatnonzero(classes == name)
            test[rows[HOLDOUT_EVERY - 1 :: HOLDOUT_EVERY]] = True
        if not test.any():
            return {}
        train_fits = _fit_all(x[~test], y[~test], classes[~test])
        if not train_fits:
            return {}
        trained = CostModel(train_fits, graph_sizes=[])
        predicted = trained.predict_many(x[test], classes[test])
        actual = y[test]
        report: dict[str, Any] = {}
        for name in STEP_CLASSES:
            mask = classes[test] == name
            if mask.any():
                report[name] = _errors(predicted[mask], actual[mask])
        report["all"] = _errors(predicted, actual)
        return report

    # --- prediction -----------------------------------------------------------------------------
    def fit_for(self, cls_name: str) -> LinearFit:
        """The fit used for a class, falling back to a related class when it has no data."""
        fits = self.fits
        if cls_name in fits:
            return fits[cls_name]
        if cls_name == "mixed" and "prefill" in fits:
            return self._composite_mixed()
        fallbacks = {
            "decode_graph": ("decode_eager", "pooled"),
            "decode_eager": ("decode_graph", "pooled"),
            "prefill": ("mixed", "pooled"),
            "mixed": ("pooled",),
        }
        for other in fallbacks[cls_name]:
            if other in fits:
                return fits[other]
        return next(iter(fits.values()))

    def _composite_mixed(self) -> LinearFit:
        """A mixed step as its prefill part (the prefill fit, over the prefill sequences) plus
        its decode part (the eager-decode slopes, over the decode sequences), one intercept.

        Prefill sequences are ``num_seqs - decode_seqs``, so the prefill fit's per-sequence slope
        moves onto ``num_seqs`` and is taken back from ``decode_seqs``.
        """
        prefill = self.fits["prefill"]
        decode = self.fits.get("decode_eager") or self.fits.get("decode_graph")
        coef = list(prefill.coef)
        if decode is not None:
            at = FEATURES.index
            per_prefill_seq = prefill.coef[at("num_seqs")]
            # A mixed step runs eager: a graph fit's padding slope is paid per real sequence.
            per_decode_seq = decode.coef[at("decode_seqs")] + decode.coef[at("padded_batch_size")]
            coef[at("decode_seqs")] = per_decode_seq - per_prefill_seq
            coef[at("decode_context_tokens")] = decode.coef[at("decode_context_tokens")]
        return LinearFit(prefill.intercept, tuple(coef), prefill.features, 0)

    def predict_many(self, x: np.ndarray, classes: np.ndarray) -> np.ndarray:
        out = np.empty(len(x))
        for name in np.unique(classes):
            mask = classes == name
            out[mask] = self.fit_for(str(name)).predict(x[mask])
        return out

    def step_timer(self) -> dict[str, tuple[float, tuple[float, ...]]]:
        """Class -> (intercept, coef) as plain floats: the simulator's per-step fast path."""
        return {name: (self.fit_for(name).intercept, self.fit_for(name).coef)
                for name in STEP_CLASSES}

    @property
    def has_graphs(self) -> bool:
        return bool(self.graph_sizes)

    def padded_size(self, batch_size: int) -> int:
        """The CUDA-graph batch a decode of ``batch_size`` is padded to; 0: it runs eager."""
        for size in self.graph_sizes:
            if size >= batch_size:
                return size
        return 0

    # --- reporting and storage ------------------------------------------------------------------
    def describe(self) -> str:
        """A few lines: what was fitted on what, and the held-out error."""
        lines = [f"step-time model from {self.source or 'a trace'}:"]
        for name in (*STEP_CLASSES, "pooled"):
            fit = self.fits.get(name)
            if fit is None:
                continue
            err = self.heldout.get(name)
            held = (
                "fallback for a class without its own fit" if name == "pooled"
                else "no held-out steps" if not err
                else f"held-out MAPE {err['mape_pct']:.1f}% on {err['n']} steps, "
                f"sum {err['sum_error_pct']:+.2f}%"
            )
            feats = ", ".join(fit.features) or "intercept only"
            lines.append(f"  {name:<12} {fit.samples:>6} steps  [{feats}]  {held}")
        total = self.heldout.get("all")
        if total:
            lines.append(
                f"  all held-out steps: MAPE {total['mape_pct']:.1f}%, "
                f"summed time {total['sum_error_pct']:+.2f}%"
            )
        for name, seconds in self.warmup_s.items():
            lines.append(f"  warm-up: the first {name} step took {seconds:+.3f} s beyond the model "
                         "(charged once per run)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": MODEL_VERSION,
            "target": "interval",
            "source": self.source,
            "fits": {name: fit.to_dict() for name, fit in self.fits.items()},
            "heldout": self.heldout,
            "graph_sizes": self.graph_sizes,
            "warmup_s": self.warmup_s,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            if data.get("version") != MODEL_VERSION:
                raise CostModelError(
                    f"{path}: cost model version {data.get('version')!r}, expected {MODEL_VERSION}"
                )
            fits = {name: LinearFit.from_dict(f) for name, f in data["fits"].items()}
            return cls(fits, data.get("source", str(path)), data.get("heldout", {}),
                       [int(s) for s in data.get("graph_sizes", [])],
                       {k: float(v) for k, v in data.get("warmup_s", {}).items()})
        except OSError as exc:
            raise CostModelError(f"{path}: cannot read cost model ({exc.strerror})") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CostModelError(f"{path}: not a cost model file ({exc})") from None


def _warmup_steps(
    x: np.ndarray, y: np.ndarray, classes: np.ndarray
) -> tuple[np.ndarray, dict[str, float]]:
    """The first step of a class that took far longer than the other steps predict (a one-off
    such as JIT compilation): a mask of such steps and, per class, the excess seconds.

    Each first step is checked against a fit of the other steps of its class, or of all other
    steps where its class has too few for its own fit.
    """
    firsts = {name: int(np.flatnonzero(classes == name)[0]) for name in np.unique(classes)}
    others = np.ones(len(y), dtype=bool)
    others[list(firsts.values())] = False
    pooled = _fit_class("pooled", x[others], y[others])
    warm = np.zeros(len(y), dtype=bool)
    excess: dict[str, float] = {}
    for name, first in firsts.items():
        rows = np.flatnonzero((classes == name) & others)
        fit = _fit_class(name, x[rows], y[rows]) or pooled
        if fit is None or len(rows) == 0:
            continue
        typical = float(np.median(np.abs(fit.predict(x[rows]) - y[rows])))
        extra = float(y[first] - fit.predict(x[first : first + 1])[0])
        if extra > max(WARMUP_OUTLIER * typical, WARMUP_MIN_FRACTION * float(np.median(y[rows]))):
            warm[first] = True
            excess[str(name)] = extra
    return warm, excess


def _errors(predicted: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    safe = np.maximum(np.abs(actual), MIN_STEP_S)
    return {
        "n": int(len(actual)),
        "mape_pct": float(100 * np.mean(np.abs(predicted - actual) / safe)),
        "sum_error_pct": float(100 * (predicted.sum() - actual.sum()) / max(actual.sum(), 1e-12)),
    }


def _observed_graph_sizes(events: RecordedEvents) -> list[int]:
    """The graph batch sizes the source run padded decodes to: Nano-vLLM's if it agrees with
    every observed (batch, padded) pair, else the sizes seen (a batch above them runs eager)."""
    ms = events.tables["model_step"]
    graph = np.asarray(ms["graph_used"], dtype=bool)
    if not graph.any():
        return []
    seqs = np.asarray(ms["num_seqs"], dtype=np.int64)[graph]
    padded = np.asarray(ms["padded_batch_size"], dtype=np.int64)[graph]
    nano = np.asarray(
        [*NANO_GRAPH_SMALL, *range(NANO_GRAPH_STRIDE, NANO_GRAPH_MAX + 1, NANO_GRAPH_STRIDE)]
    )
    expected = nano[np.minimum(np.searchsorted(nano, seqs), len(nano) - 1)]
    if (expected == padded).all():
        return nano.tolist()
    return sorted(set(padded.tolist()))
