"""The step-time model: how long one engine step takes, from the batch features it records.

Fitted separately per step class (eager prefill, prefill through a CUDA graph, decode with a CUDA
graph, eager decode, mixed) on a trace's ``model_step`` rows (``replay.whatif.cost.fit``: linear
candidates and, for eager classes, ``max(launch floor, linear)`` ones, chosen by held-out error).
The target is the step's *interval*: the wall time from the end of the previous step (or the
latest arrival, after an idle gap) to the end of this one. That is what a run's makespan is the
sum of: device time plus the engine's own CPU work between steps (scheduling, input
preparation, recording), which a device-only duration misses.

Two modes, by what the trace measured:
- *interval* mode (a version-1 trace: no ``host_s``): each class's fit is of the interval itself.
- *overlap* mode (a version-2 trace, which records each step's host work ``host_s`` and whether
  it was launched while the previous step ran, ``overlapped``): each class's fit is of the device
  time (``duration_s``), a host-time model is fitted on ``host_s`` and a step's interval is
  ``device + host`` for a sequential CUDA-graph step, ``max(device, host)`` for an eager or an
  overlapped one, plus a per-mode offset fitted on the source (``replay.whatif.cost.overlap``). So a
  target that overlaps another fraction of its steps than the source is priced by its own launch
  decisions.

Warm-up (``replay.whatif.cost.classes``): a first step of a class far slower than its class predicts is
a one-off, charged once per simulated run; the run's first steps (its warm-up window) are left
out of a class's fit where later steps cover their range, and bound it from above where none do.
``replay.whatif.cost.coverage`` says what the source cannot identify and where a target lies outside it.

CUDA graphs (``replay.whatif.cost.graphs``): the model keeps the decode batch sizes and prefill token
counts the source captured, so a simulation pads its steps as the source's engine would. A class
the source never ran is priced from related ones (``replay.whatif.cost.fallbacks``), and says so.

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
from replay.whatif.cost.classes import (
    NAME_WIDTH,
    STEP_CLASSES,
    fit_all,
    warmup_steps,
    warmup_window,
)
from replay.whatif.cost.coverage import class_coverage, source_caveats, target_warnings
from replay.whatif.cost.fallbacks import fallback_words, related_fit
from replay.whatif.cost.fit import (
    FEATURES,
    HOLDOUT_EVERY,
    MIN_STEP_S,
    LinearFit,
    errors,
    fit_linear,
    surrogate,
)
from replay.whatif.cost.graphs import observed_graph_sizes, source_prefill_graphs
from replay.whatif.cost.overlap import (
    OverlapModel,
    calibration_host_rows,
    calibration_residuals,
    evaluate,
    has_host_times,
    overlapped_flags,
)
from replay.whatif.cost.steps import feature_matrix, step_class, step_intervals, with_calibration

__all__ = ["FEATURES", "MIN_STEP_S", "CostModel", "CostModelError", "LinearFit", "feature_matrix",
           "fit_linear", "step_class", "step_intervals"]

MODEL_VERSION = 4
# Version 1: no floors, no coverage; version 2: no overlap mode; version 3: no prefill graphs
# (nor the padded_tokens feature: its coefficient reads 0).
READABLE_VERSIONS = (1, 2, 3, 4)


class CostModelError(ReplayLLMError):
    """A step-time model cannot be fitted or loaded."""


@dataclass
class CostModel:
    """Per-class fits plus how the source run padded decode batches and prefill tokens for CUDA
    graphs.

    ``overlap`` None: interval mode, ``fits`` are of step intervals. Else overlap mode: ``fits``
    are of device time, and ``overlap`` holds the host-time fits and the rule's offsets.
    """

    fits: dict[str, LinearFit]
    source: str = ""
    heldout: dict[str, Any] = field(default_factory=dict)
    graph_sizes: list[int] = field(default_factory=list)  # empty: the source ran no graphs
    # Class -> seconds the first step of that class took beyond the fit (JIT compilation,
    # lazy allocation): charged once per run, kept out of the per-step fit.
    warmup_s: dict[str, float] = field(default_factory=dict)
    # Class -> plain linear stand-in for a floored fit (``step_timer()`` without floors).
    surrogates: dict[str, LinearFit] = field(default_factory=dict)
    # Class -> the range its fit rests on (``cost_coverage.class_coverage``), and the choice.
    coverage: dict[str, dict[str, Any]] = field(default_factory=dict)
    selection: dict[str, dict[str, Any]] = field(default_factory=dict)
    window_steps: int = 0
    overlap: OverlapModel | None = None
    # Token counts the source captured prefill graphs for, ascending (empty: none), and the most
    # sequences one graph prefill takes.
    prefill_graph_sizes: list[int] = field(default_factory=list)
    prefill_graph_max_seqs: int = 0

    # --- fitting --------------------------------------------------------------------------------
    @classmethod
    def fit(cls, events: RecordedEvents, source: str = "") -> CostModel:
        """Fit from a recording with measured step times; held-out error in ``heldout``."""
        if not has_timings(events):
            raise CostModelError(
                f"{source or 'the trace'} has no measured step times (recorded without a model)"
            )
        x, classes = feature_matrix(events)
        interval = step_intervals(events)
        overlap = has_host_times(events)  # overlap mode: fit device time, and host time apart
        ms = events.tables["model_step"]
        y = np.asarray(ms["duration_s"], dtype=float) if overlap else interval
        leading = warmup_window(x, y, classes)
        window = np.arange(len(y)) < leading
        warm, warmup_s = warmup_steps(x, y, classes, window)
        keep = ~warm
        x, y, classes, window = x[keep], y[keep], classes[keep], window[keep]
        steps = len(y)  # the run's own steps; calibration rows follow them
        x, y, classes, window = with_calibration(events, x, y, classes, window, device=overlap)
        fits, reports = fit_all(x, y, classes, window)
        if not fits:
            raise CostModelError(f"{source or 'the trace'} has too few steps to fit a model")
        prefill_sizes, prefill_max_seqs = source_prefill_graphs(events)
        model = cls(fits, source=source, graph_sizes=observed_graph_sizes(events),
                    warmup_s=warmup_s, selection=reports, window_steps=leading,
                    prefill_graph_sizes=prefill_sizes, prefill_graph_max_seqs=prefill_max_seqs)
        for name, report in reports.items():
            mask = classes == name
            model.coverage[name] = class_coverage(name, x[mask], ~window[mask], fits[name],
                                                  report)
            if fits[name].floor > 0:
                model.surrogates[name] = surrogate(fits[name], x[mask])
        model.heldout = model._evaluate(x, y, classes, window)
        if overlap:
            own = slice(0, steps)
            data = (x[own], np.asarray(ms["host_s"], dtype=float)[keep], classes[own],
                    window[own], overlapped_flags(events)[keep], interval[keep], y[own])
            calibration = calibration_residuals(events.header.get("calibration") or [],
                                                step_class)
            host_rows = calibration_host_rows(events.header.get("calibration") or [], step_class)
            model.overlap = OverlapModel.fit(*data, calibration, host_rows)
            model.overlap.heldout = evaluate(*data, _device_trainer(x, y, classes, window,
                                                                    steps), calibration, host_rows)
        return model

    def _evaluate(self, x: np.ndarray, y: np.ndarray, classes: np.ndarray,
                  window: np.ndarray) -> dict[str, Any]:
        """Refit without every HOLDOUT_EVERY-th step of each class; error on those steps."""
        test = np.zeros(len(y), dtype=bool)
        for name in STEP_CLASSES:
            rows = np.flatnonzero(classes == name)
            test[rows[HOLDOUT_EVERY - 1 :: HOLDOUT_EVERY]] = True
        if not test.any():
            return {}
        train_fits, _ = fit_all(x[~test], y[~test], classes[~test], window[~test])
        if not train_fits:
            return {}
        trained = CostModel(train_fits, graph_sizes=[])
        predicted = trained.predict_many(x[test], classes[test])
        actual = y[test]
        report: dict[str, Any] = {}
        for name in STEP_CLASSES:
            mask = classes[test] == name
            if mask.any():
                report[name] = errors(predicted[mask], actual[mask])
        report["all"] = errors(predicted, actual)
        return report

    # --- prediction -----------------------------------------------------------------------------
    def fit_for(self, cls_name: str, with_floor: bool = True) -> LinearFit:
        """The fit used for a class, falling back to related fits when it has no data
        (``replay.whatif.cost.fallbacks``); ``with_floor=False``: a plain linear stand-in where that
        fit has a floor."""
        return related_fit(self.fits, self.surrogates, cls_name, with_floor)

    def fallback(self, cls_name: str) -> str:
        """What a class the source has no fit for is priced from, in words ("": its own)."""
        return fallback_words(self.fits, cls_name)

    def predict_many(self, x: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """What ``fits`` predict: intervals (interval mode) or device times (overlap mode)."""
        out = np.empty(len(x))
        for name in np.unique(classes):
            mask = classes == name
            out[mask] = self.fit_for(str(name)).predict(x[mask])
        return out

    @property
    def mode(self) -> str:
        return "interval" if self.overlap is None else "overlap"

    def predict_intervals(self, x: np.ndarray, classes: np.ndarray,
                          overlapped: np.ndarray | None = None) -> np.ndarray:
        """Each step's interval; in overlap mode by the rule, per step ``overlapped`` (default:
        none). One-off warm-up costs are not included."""
        fitted = self.predict_many(x, classes)
        if self.overlap is None:
            return fitted
        flags = np.zeros(len(x), dtype=bool) if overlapped is None else np.asarray(overlapped,
                                                                                   dtype=bool)
        return self.overlap.intervals(fitted, self.overlap.predict_host(x, classes), flags,
                                      classes)

    def step_timer(self, with_floor: bool = False) -> dict[str, tuple[Any, ...]]:
        """Class -> (intercept, coef) as plain floats: the simulator's per-step fast path, a
        plain linear function (a floored fit's stand-in). ``with_floor``: (intercept, coef,
        floor), the exact model: seconds = max(floor, intercept + coef . features)."""
        out: dict[str, tuple[Any, ...]] = {}
        for name in STEP_CLASSES:
            fit = self.fit_for(name, with_floor)
            out[name] = (fit.intercept, fit.coef, fit.floor) if with_floor else (
                fit.intercept, fit.coef)
        return out

    @property
    def has_graphs(self) -> bool:
        return bool(self.graph_sizes)

    @property
    def has_prefill_graphs(self) -> bool:
        return bool(self.prefill_graph_sizes)

    def padded_size(self, batch_size: int) -> int:
        """The CUDA-graph batch a decode of ``batch_size`` is padded to; 0: it runs eager."""
        for size in self.graph_sizes:
            if size >= batch_size:
                return size
        return 0

    # --- caveats --------------------------------------------------------------------------------
    def caveats(self) -> list[str]:
        """What the source trace cannot identify (``cost_coverage.source_caveats``)."""
        overlap = self.overlap.caveats() if self.overlap is not None else []
        graphs = []
        if self.prefill_graph_sizes and "prefill_graph" not in self.fits:
            graphs.append("prefill_graph: the source captured prefill CUDA graphs but no step "
                          "it timed ran through one: a graph prefill is priced from "
                          f"{self.fallback('prefill_graph')}")
        return source_caveats(self.coverage, self.window_steps) + overlap + graphs

    def coverage_warnings(self, target: RecordedEvents) -> list[str]:
        """Where ``target``'s steps (a simulation's or a recording's) lie well outside the range
        of the source's steps for their class: a prediction there may be off, and why."""
        x, classes = feature_matrix(target)
        related = {str(name): self.fallback(str(name)) for name in np.unique(classes)}
        return target_warnings(self.coverage, set(self.fits) - {"pooled"}, self.window_steps,
                               x, classes, related)

    # --- reporting and storage ------------------------------------------------------------------
    def describe(self, target: RecordedEvents | None = None) -> str:
        """A few lines: what was fitted on what, the held-out error, what the source cannot
        identify and (given a ``target`` event stream) where the target lies outside it."""
        mode = (
            "interval mode: fitted on each step's wall interval; the trace records no host time"
            if self.overlap is None else
            "overlap mode: device time per class below, then host time and the overlap rule"
        )
        lines = [f"step-time model from {self.source or 'a trace'} ({mode}):"]
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
            if fit.floor > 0:
                feats = f"max({1e3 * fit.floor:.2f} ms floor, {feats})"
            chosen = self.selection.get(name, {}).get("holdout")
            how = f" (chosen by {chosen} held-out error)" if chosen else ""
            lines.append(f"  {name:<{NAME_WIDTH}} {fit.samples:>6} steps  [{feats}]{how}  {held}")
        total = self.heldout.get("all")
        if total:
            what = " (device time)" if self.overlap is not None else ""
            lines.append(
                f"  all held-out steps{what}: MAPE {total['mape_pct']:.1f}%, "
                f"summed time {total['sum_error_pct']:+.2f}%"
            )
        if self.prefill_graph_sizes:
            sizes = self.prefill_graph_sizes
            lines.append(f"  prefill CUDA graphs: {len(sizes)} token counts, {sizes[0]:,} to "
                         f"{sizes[-1]:,}, up to {self.prefill_graph_max_seqs} sequences each "
                         "(a prefill within them is padded to the next and runs as prefill_graph)")
        if self.overlap is not None:
            lines += self.overlap.describe_lines()
        for name, seconds in self.warmup_s.items():
            lines.append(f"  warm-up: the first {name} step took {seconds:+.3f} s beyond the model "
                         "(charged once per run)")
        if self.window_steps:
            lines.append(f"  warm-up window: the run's first {self.window_steps} steps (left out "
                         "where later steps cover their range)")
        lines += [f"  warning: {line}" for line in self.caveats()]
        if target is not None:
            lines += [f"  warning: {line}" for line in self.coverage_warnings(target)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": MODEL_VERSION,
            "target": "interval" if self.overlap is None else "device+host",
            "source": self.source,
            "fits": {name: fit.to_dict() for name, fit in self.fits.items()},
            "surrogates": {name: fit.to_dict() for name, fit in self.surrogates.items()},
            "heldout": self.heldout,
            "graph_sizes": self.graph_sizes,
            "warmup_s": self.warmup_s,
            "coverage": self.coverage,
            "selection": self.selection,
            "window_steps": self.window_steps,
            "overlap": self.overlap.to_dict() if self.overlap is not None else None,
            "prefill_graph_sizes": self.prefill_graph_sizes,
            "prefill_graph_max_seqs": self.prefill_graph_max_seqs,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            if data.get("version") not in READABLE_VERSIONS:
                raise CostModelError(
                    f"{path}: cost model version {data.get('version')!r}, expected {MODEL_VERSION}"
                )
            fits = {name: LinearFit.from_dict(f) for name, f in data["fits"].items()}
            surrogates = {name: LinearFit.from_dict(f)
                          for name, f in data.get("surrogates", {}).items()}
            return cls(fits, data.get("source", str(path)), data.get("heldout", {}),
                       [int(s) for s in data.get("graph_sizes", [])],
                       {k: float(v) for k, v in data.get("warmup_s", {}).items()},
                       surrogates, data.get("coverage", {}), data.get("selection", {}),
                       int(data.get("window_steps", 0)),
                       OverlapModel.from_dict(data["overlap"]) if data.get("overlap") else None,
                       [int(s) for s in data.get("prefill_graph_sizes", [])],
                       int(data.get("prefill_graph_max_seqs", 0)))
        except OSError as exc:
            raise CostModelError(f"{path}: cannot read cost model ({exc.strerror})") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CostModelError(f"{path}: not a cost model file ({exc})") from None


def _device_trainer(x: np.ndarray, y: np.ndarray, classes: np.ndarray, window: np.ndarray,
                    steps: int) -> Any:
    """For ``cost_overlap.evaluate``: device fits on the run's steps a mask selects (of the
    first ``steps`` rows) plus every calibration row, as a predictor (None: too few steps)."""
    def train(mask: np.ndarray) -> Any:
        use = np.concatenate([mask, np.ones(len(y) - steps, dtype=bool)])
        fits, _ = fit_all(x[use], y[use], classes[use], window[use])
        if not fits:
            return None
        trained = CostModel(fits)
        return trained.predict_many
    return train

