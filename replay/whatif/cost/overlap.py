"""Overlap-aware step times: device time and host time, combined by how each step was launched.

A version-2 trace records, per step, its device time (``duration_s``), the engine thread's own
host work (``host_s``: scheduling, input staging and launch, post-processing, recording; not the
time it blocked waiting for the device) and whether the step was launched while the previous one
was still on the device (``overlapped``). The wall time a step adds to a run (its *interval*) is
then, by the rule the simulator applies:

- a sequential CUDA-graph step (a decode, or a prefill replayed from a graph: one launch, not
  launch-bound): device + host + offset(sequential, class)
- a sequential eager step (eager prefill, mixed, eager decode): max(device, host) +
  offset(sequential, class): its kernels run on the device while the host is still launching
  the later ones, so whichever is longer bounds it (a small eager prefill is launch-bound:
  device and host both ~25 ms on the H200, the interval the same)
- an overlapped step: max(device, host) + offset(overlapped, class) (its host work ran while
  the device was busy with the step before)

The device part is the cost model's per-class device fits (``replay.whatif.cost.model``), the host part
the host-time fits of ``replay.whatif.cost.host`` (a constant per class plus per-sequence and per-token
costs shared by every class).

The offsets are what the rule misses systematically, measured on the source: per class and mode,
the (1%-trimmed) mean of ``interval - rule(duration_s, host_s)`` over its steps of that mode
(measured times, so a warm-up step, slow in both, tells as much as any). Physically, a sequential
step pays a sync latency (the device finishing, the host noticing). Where a class has too few
steps of a mode for a mean but a few besides its first (which may pay one-off costs), their
median: the run's own overhead around a step, which no calibration step shows. With fewer still,
its sequential offset comes from the header's start-up calibration steps of its class that
record the time the executor waited for the device (``wait_s``: ``calibration_residuals``),
else it is the sync latency of the other sequential steps (or of the calibration steps). A
class with too few overlapped steps takes the offset of all overlapped steps (0 where there are
none). The model says which offsets it could not measure.

A run that overlaps another fraction of its steps than the source (another config, or async
scheduling off) is thus priced by its own launch decisions, which the engine takes from scheduler
state alone and a simulation reproduces (``ScheduledBatch.overlapped``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replay.whatif.cost.classes import NAME_WIDTH, STEP_CLASSES, one_off_excess
from replay.whatif.cost.fit import (
    EAGER_CLASSES,
    FEATURES,
    HOLDOUT_EVERY,
    MIN_STEP_S,
    LinearFit,
    errors,
)
from replay.whatif.cost.host import fit_host, predict
from replay.whatif.cost.steps import calibration_features

# The host fit of a class the source did not run: the first of these it did. An eager step's host
# work is its kernel launches (a mixed step's like a prefill's); a CUDA-graph step's is staging,
# one graph launch and sampling, whether it replays a prefill or a decode graph.
HOST_FALLBACKS = {"prefill": ("mixed",), "mixed": ("prefill",),
                  "prefill_graph": ("decode_graph",),
                  "decode_graph": ("prefill_graph", "decode_eager"),
                  "decode_eager": ("decode_graph",)}
MODES = ("sequential", "overlapped")
# A trace whose typical step has less host time than this did not measure it (zeros, rounding).
HOST_MEASURED_S = 1e-6
# A class's offset for a mode is measured on at least this many of its steps (else derived).
MIN_OFFSET_STEPS = 8
# Fewer steps of a class and mode than MIN_OFFSET_STEPS, but this many besides the class's first
# (which may pay one-off costs): their median, still the run's own overhead around a step, which
# the start-up calibration (an executor call alone) does not see.
FEW_OFFSET_STEPS = 3
TRIM = 0.01  # offsets: the mean of residuals between these quantiles (a stray stall ignored)


def has_host_times(events: Any) -> bool:
    """Whether the trace measured each step's host work (schema 2 and a real measurement: a
    version-1 trace reads NaN; a recorder that measured nothing wrote zeros, or rounding noise:
    a real step's host work takes microseconds at least)."""
    ms = events.tables["model_step"]
    if "host_s" not in ms:
        return False
    host = np.asarray(ms["host_s"], dtype=float)
    return (len(host) > 0 and bool(np.isfinite(host).all())
            and float(np.median(host)) > HOST_MEASURED_S)


def overlapped_flags(events: Any) -> np.ndarray:
    ms = events.tables["model_step"]
    if "overlapped" not in ms:
        return np.zeros(len(ms["step"]), dtype=bool)
    return np.asarray(ms["overlapped"], dtype=bool)


def combine(device: np.ndarray, host: np.ndarray, overlapped: np.ndarray,
            offset: np.ndarray | float = 0.0, classes: np.ndarray | None = None) -> np.ndarray:
    """The interval of each step by the overlap rule (``offset``: per step, or one for all;
    ``classes``: the step classes, whose eager ones take the max rule when sequential too)."""
    parallel = np.asarray(overlapped, dtype=bool)
    if classes is not None:
        parallel = parallel | np.isin(np.asarray(classes).astype(str), list(EAGER_CLASSES))
    out = np.where(parallel, np.maximum(device, host), device + host) + offset
    return np.maximum(out, MIN_STEP_S)


def _typical(residuals: np.ndarray) -> float:
    lo, hi = np.quantile(residuals, [TRIM, 1 - TRIM])
    return float(residuals[(residuals >= lo) & (residuals <= hi)].mean())


def _firsts(classes: np.ndarray) -> np.ndarray:
    mask = np.zeros(len(classes), dtype=bool)
    for name in np.unique(classes):
        mask[np.flatnonzero(classes == name)[0]] = True
    return mask


@dataclass
class OverlapModel:
    """Host-time fits per class and the rule's offsets per mode and class (module docstring)."""

    host: dict[str, LinearFit]
    # Mode -> class -> seconds added to the rule; and how each was obtained ("measured on N
    # steps", or derived), for reporting.
    offsets: dict[str, dict[str, float]] = field(default_factory=dict)
    offset_source: dict[str, dict[str, str]] = field(default_factory=dict)
    sync_s: float = 0.0  # a sequential step's sync latency
    source_steps: dict[str, int] = field(default_factory=dict)  # source steps per mode
    host_warmup_s: dict[str, float] = field(default_factory=dict)
    selection: dict[str, Any] = field(default_factory=dict)
    heldout: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fit(cls, x: np.ndarray, host: np.ndarray, classes: np.ndarray, window: np.ndarray,
            overlapped: np.ndarray, interval: np.ndarray, device: np.ndarray,
            calibration: tuple[np.ndarray, np.ndarray] | None = None,
            host_rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> OverlapModel:
        """``device``: measured device times; ``calibration``: the classes and sequential
        residuals of calibration steps (``calibration_residuals``);
        ``host_rows``: features, host times and classes of calibration steps, fitted with the
        run's steps (``calibration_host_rows``: step sizes the run never took).
        Each class's first step is left out of the host fit and, if far above it, charged once
        per run."""
        firsts = _firsts(classes)
        hx, hy, hc, hw = x[~firsts], host[~firsts], classes[~firsts], window[~firsts]
        if host_rows is not None and len(host_rows[1]):
            hx, hy = np.vstack([hx, host_rows[0]]), np.concatenate([hy, host_rows[1]])
            hc = np.concatenate([hc, host_rows[2]])
            hw = np.concatenate([hw, np.zeros(len(host_rows[1]), dtype=bool)])
        fits, selection = fit_host(hx, hy, hc, hw)
        model = cls(fits, selection=selection)
        predicted = model.predict_host(x, classes)
        for row in np.flatnonzero(firsts):
            name = str(classes[row])
            others = (classes == name) & ~firsts
            if not others.any():
                continue
            # The same one-off rule as a first step's device time (cost_classes.warmup_steps).
            extra = one_off_excess(float(predicted[row]), float(host[row]), predicted[others],
                                   host[others])
            if extra is not None:
                model.host_warmup_s[name] = extra
        model._fit_offsets(classes, overlapped,
                           interval - combine(device, host, overlapped, classes=classes),
                           calibration, firsts)
        return model

    def _fit_offsets(self, classes: np.ndarray, overlapped: np.ndarray, residual: np.ndarray,
                     calibration: tuple[np.ndarray, np.ndarray] | None,
                     firsts: np.ndarray) -> None:
        cal_classes, cal_residual = calibration if calibration is not None else (
            np.zeros(0, dtype=str), np.zeros(0))

        sequential = ~overlapped
        if sequential.sum() >= MIN_OFFSET_STEPS:
            self.sync_s = _typical(residual[sequential])
        elif len(cal_residual):
            self.sync_s = float(np.median(cal_residual))
        overall = _typical(residual[overlapped]) if overlapped.sum() >= MIN_OFFSET_STEPS else 0.0
        self.source_steps = {"sequential": int(sequential.sum()),
                             "overlapped": int(overlapped.sum())}
        for mode, rows_of_mode in zip(MODES, (sequential, overlapped)):
            self.offsets[mode], self.offset_source[mode] = {}, {}
            for name in STEP_CLASSES:
                rows = rows_of_mode & (classes == name)
                cal = cal_classes == name
                later = rows & ~firsts
                if rows.sum() >= MIN_OFFSET_STEPS:
                    value, how = _typical(residual[rows]), f"measured on {int(rows.sum())} steps"
                elif later.sum() >= FEW_OFFSET_STEPS:
                    value = float(np.median(residual[later]))
                    how = f"median of {int(later.sum())} steps (the class's first left out)"
                elif mode == "sequential" and cal.any():
                    value = float(np.median(cal_residual[cal]))
                    how = f"measured on {int(cal.sum())} calibration steps"
                elif mode == "sequential":
                    value = self.sync_s
                    how = "derived: the sync latency of the other sequential steps"
                else:
                    value = overall
                    how = (f"all {int(overlapped.sum())} overlapped steps"
                           if overlapped.sum() >= MIN_OFFSET_STEPS else "none: 0")
                self.offsets[mode][name], self.offset_source[mode][name] = value, how

    # --- prediction -----------------------------------------------------------------------------
    def host_fit(self, cls_name: str) -> LinearFit:
        """A class's host fit; for a class the source did not run, a related class's constant
        (``HOST_FALLBACKS``: a mixed step's is a prefill's, both launch eagerly), with the shared
        slopes."""
        if cls_name in self.host:
            return self.host[cls_name]
        for other in HOST_FALLBACKS.get(cls_name, ()):
            if other in self.host:
                return self.host[other]
        if not self.host:
            return LinearFit(0.0, (0.0,) * len(FEATURES), (), 0)
        return self.host[next(n for n in (*STEP_CLASSES, *self.host) if n in self.host)]

    def predict_host(self, x: np.ndarray, classes: np.ndarray) -> np.ndarray:
        fits = {str(name): self.host_fit(str(name)) for name in np.unique(classes)}
        return predict(fits, x, classes)

    def offset(self, mode: str, cls_name: str) -> float:
        return self.offsets.get(mode, {}).get(cls_name, 0.0)

    def intervals(self, device: np.ndarray, host: np.ndarray, overlapped: np.ndarray,
                  classes: np.ndarray) -> np.ndarray:
        offset = np.array([self.offset(MODES[int(flag)], str(name))
                           for flag, name in zip(overlapped, classes)])
        return combine(device, host, overlapped, offset, classes)

    def host_timer(self) -> dict[str, tuple[float, tuple[float, ...], float, float]]:
        """Class -> (intercept, coef over FEATURES, sequential offset, overlapped offset): the
        simulator's per-step host time and rule."""
        return {name: (self.host_fit(name).intercept, self.host_fit(name).coef,
                       self.offset("sequential", name), self.offset("overlapped", name))
                for name in STEP_CLASSES}

    # --- reporting and storage ------------------------------------------------------------------
    def caveats(self) -> list[str]:
        """Offsets the source could not measure, for the classes it ran (only decodes are ever
        launched overlapped)."""
        lines = []
        for name in STEP_CLASSES:
            if name not in self.host:
                continue
            how = self.offset_source.get("sequential", {}).get(name, "")
            if how.startswith("derived"):
                lines.append(
                    f"{name}: too few sequential steps in the source to measure their offset: "
                    f"{1e3 * self.offset('sequential', name):+.3f} ms ({how})")
            how = self.offset_source.get("overlapped", {}).get(name, "")
            if name.startswith("decode") and not how.startswith("measured"):
                lines.append(
                    f"{name}: too few overlapped steps in the source to measure their offset: "
                    f"{1e3 * self.offset('overlapped', name):+.3f} ms (from {how})")
        return lines

    def describe_lines(self) -> list[str]:
        fits = [(name, self.host[name]) for name in STEP_CLASSES if name in self.host]
        shared = fits[0][1] if fits else None
        slopes = ", ".join(f"{1e6 * shared.coef[FEATURES.index(f)]:.3f} us x {f}"
                           for f in shared.features) if shared is not None else ""
        lines = ["  host time per step (the engine's own CPU work, fitted on host_s): a constant "
                 f"per class + {slopes or 'no slope'} (chosen by held-out error)"]
        held = self.heldout.get("host", {})
        for name, fit in fits:
            err = held.get(name)
            score = (f"held-out MAPE {err['mape_pct']:.1f}% on {err['n']} steps, "
                     f"sum {err['sum_error_pct']:+.2f}%" if err else "")
            lines.append(f"    {name:<{NAME_WIDTH}} {fit.samples:>6} steps  "
                         f"{1e3 * fit.intercept:.3f} ms  {score}".rstrip())
        steps = self.source_steps
        lines.append(f"  interval = device + host + offset for a sequential step "
                     f"({steps.get('sequential', 0)} in the source), max(device, host) + offset "
                     f"for an overlapped one ({steps.get('overlapped', 0)}); offsets:")
        for name in STEP_CLASSES:
            if name not in self.host:
                continue
            modes = MODES if name.startswith("decode") else MODES[:1]  # only decodes overlap
            parts = [f"{mode} {1e3 * self.offset(mode, name):+.3f} ms "
                     f"({self.offset_source.get(mode, {}).get(name, '')})" for mode in modes]
            lines.append(f"    {name:<{NAME_WIDTH}} " + ", ".join(parts))
        interval = self.heldout.get("interval", {})
        if interval.get("all"):
            parts = [f"{mode} MAPE {interval[mode]['mape_pct']:.1f}% on {interval[mode]['n']}"
                     for mode in MODES if interval.get(mode)]
            lines.append(
                f"  interval held-out: MAPE {interval['all']['mape_pct']:.1f}%, summed time "
                f"{interval['all']['sum_error_pct']:+.2f}% ({'; '.join(parts)})")
        for name, seconds in self.host_warmup_s.items():
            lines.append(f"  host warm-up: the first {name} step's host work took "
                         f"{seconds:+.3f} s beyond the model (charged once per run)")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": {name: fit.to_dict() for name, fit in self.host.items()},
            "offsets": self.offsets,
            "offset_source": self.offset_source,
            "sync_s": self.sync_s,
            "source_steps": self.source_steps,
            "host_warmup_s": self.host_warmup_s,
            "selection": self.selection,
            "heldout": self.heldout,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OverlapModel:
        return cls(
            {name: LinearFit.from_dict(f) for name, f in data["host"].items()},
            {mode: {k: float(v) for k, v in by.items()} for mode, by in data["offsets"].items()},
            data.get("offset_source", {}),
            float(data.get("sync_s", 0.0)),
            {k: int(v) for k, v in data.get("source_steps", {}).items()},
            {k: float(v) for k, v in data.get("host_warmup_s", {}).items()},
            data.get("selection", {}),
            data.get("heldout", {}),
        )


def calibration_residuals(rows: list[dict[str, Any]], step_class: Callable[[str, bool], str]
                          ) -> tuple[np.ndarray, np.ndarray] | None:
    """Classes and sequential residuals of the header's calibration steps that record
    ``wait_s``, the time the executor waited for the device (None: none do). A row's host work
    is ``interval_s - wait_s``, so its residual by the rule is ``wait_s - duration_s`` for a
    CUDA-graph decode and ``interval_s - max(duration_s, host)`` for an eager step."""
    timed = [row for row in rows if row.get("wait_s") is not None]
    if not timed:
        return None
    classes = np.array([step_class(row["kind"], bool(row["graph_used"])) for row in timed])
    interval = np.array([float(row["interval_s"]) for row in timed])
    wait = np.array([float(row["wait_s"]) for row in timed])
    device = np.array([float(row["duration_s"]) for row in timed])
    host = interval - wait
    residual = interval - combine(device, host, np.zeros(len(timed), dtype=bool),
                                  classes=classes)
    return classes, residual


def calibration_host_rows(rows: list[dict[str, Any]], step_class: Callable[[str, bool], str]
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Features, host times (``interval_s - wait_s``: the executor's own CPU work) and classes
    of the calibration steps that record ``wait_s``, for the host fit. The engine's work around
    a real step (scheduling, post-processing) is absent from them; for an eager step, whose
    host time is its kernel launches, that is a small part."""
    timed = [row for row in rows if row.get("wait_s") is not None]
    if not timed:
        return None
    x = calibration_features(timed)
    host = np.array([float(row["interval_s"]) - float(row["wait_s"]) for row in timed])
    classes = np.array([step_class(row["kind"], bool(row["graph_used"])) for row in timed])
    return x, host, classes


def evaluate(x: np.ndarray, host: np.ndarray, classes: np.ndarray, window: np.ndarray,
             overlapped: np.ndarray, interval: np.ndarray, device: np.ndarray,
             train_device: Callable[[np.ndarray], Any],
             calibration: tuple[np.ndarray, np.ndarray] | None = None,
             host_rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
             ) -> dict[str, Any]:
    """Held-out errors of the host fits and of the predicted intervals: every HOLDOUT_EVERY-th
    step of each class is held out, the device fits (``train_device(train_mask)``: a predictor
    ``(x, classes) -> seconds``, or None), host fits and offsets are
    refitted on the others; a held-out step's interval is predicted from predicted device and
    host times, as the simulator does."""
    test = np.zeros(len(host), dtype=bool)
    for name in np.unique(classes):
        rows = np.flatnonzero(classes == name)
        test[rows[HOLDOUT_EVERY - 1 :: HOLDOUT_EVERY]] = True
    train = ~test
    predict_device = train_device(train) if test.any() and train.any() else None
    if predict_device is None:
        return {}
    model = OverlapModel.fit(x[train], host[train], classes[train], window[train],
                             overlapped[train], interval[train], device[train],
                             calibration, host_rows)
    host_pred = model.predict_host(x[test], classes[test])
    predicted = model.intervals(predict_device(x[test], classes[test]), host_pred,
                                overlapped[test], classes[test])
    report: dict[str, Any] = {"host": {}, "interval": {}}
    for name in STEP_CLASSES:
        mask = classes[test] == name
        if mask.any():
            report["host"][name] = errors(host_pred[mask], host[test][mask])
    for mode, flag in zip(MODES, (False, True)):
        mask = overlapped[test] == flag
        if mask.any():
            report["interval"][mode] = errors(predicted[mask], interval[test][mask])
    report["interval"]["all"] = errors(predicted, interval[test])
    return report
