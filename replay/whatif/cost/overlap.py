"""How device and host time make a step's interval: the one rule (``interval``) and overlap
mode's host-time fits and offsets (``OverlapModel``), per class and launch mode."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from replay.whatif.cost import features, warmup
from replay.whatif.cost import fit as fitting
from replay.whatif.cost.features import (
    FEATURES,
    MIN_STEP_S,
    MODES,
    STEP_CLASSES,
    LinearFit,
    Steps,
)
from replay.whatif.cost.roofline import PREFILL_CLASSES  # the classes that schedule prompts

MIN_OFFSET_STEPS = 8  # an offset measured on fewer steps of its class and mode is derived
FEW_OFFSET_STEPS = 3
TRIM = 0.01  # offsets: the mean of residuals between these quantiles (a stray stall ignored)
SPREAD_QUANTILES = 16  # host_spread: the levels an overlapped step's host time is taken at


def interval(device: float, host: float, parallel: bool, offset: float = 0.0,
             spread: tuple[float, ...] = ()) -> float:
    """The wall time a step adds to a run, from its device and host time: ``max(device, host)``
    for a ``parallel`` step (launched overlapped, its host work ran while the device was busy;
    or eager, its kernels run while the host still launches later ones), ``device + host`` for
    a sequential CUDA-graph step; plus ``offset``, and never below ``MIN_STEP_S``. ``spread``
    (an overlapped step's, ``host_spread``): the host time's quantiles over its mean, so the
    overlap is the mean of ``max(device, host x r)`` over them, the steps whose host work
    outlasts the device's paying the difference (the mean of a max exceeds the max of means)."""
    if not parallel:
        return max(device + host + offset, MIN_STEP_S)
    if spread and host * spread[-1] > device:
        base = sum(max(device, host * r) for r in spread) / len(spread)
    else:
        base = max(device, host)
    return max(base + offset, MIN_STEP_S)


def intervals(device: np.ndarray, host: np.ndarray, overlapped: np.ndarray, classes: np.ndarray,
              offsets: np.ndarray | float = 0.0, spread: tuple[float, ...] = ()) -> np.ndarray:
    """``interval`` of each step (an eager class is parallel when sequential too; ``spread``
    for the overlapped steps)."""
    over = np.asarray(overlapped, dtype=bool)
    parallel = over | np.isin(np.asarray(classes).astype(str), list(features.EAGER_CLASSES))
    offsets = np.broadcast_to(np.asarray(offsets, dtype=float), parallel.shape)
    return np.array([interval(d, h, p, o, spread if launched else ()) for d, h, p, o, launched
                     in zip(np.asarray(device, dtype=float).tolist(),
                            np.asarray(host, dtype=float).tolist(), parallel.tolist(),
                            offsets.tolist(), over.tolist())], dtype=float)


def host_spread(run: Steps, predicted: np.ndarray) -> tuple[float, ...]:
    """How a step's host time spreads about its fit: ``SPREAD_QUANTILES`` quantiles of the
    ratio of measured to predicted host time over the run's overlapped steps of its most
    frequent class, scaled to mean 1 (so the fit stays the mean); () where too few."""
    names, counts = np.unique(run.classes[run.overlapped], return_counts=True)
    if not len(names):
        return ()
    rows = run.overlapped & (run.classes == names[np.argmax(counts)]) & (predicted > 0)
    rows &= np.isfinite(run.host)
    if rows.sum() < MIN_OFFSET_STEPS * SPREAD_QUANTILES // 4:
        return ()
    ratio = run.host[rows] / predicted[rows]
    levels = np.quantile(ratio, (np.arange(SPREAD_QUANTILES) + 0.5) / SPREAD_QUANTILES)
    if levels.mean() <= 0:
        return ()
    return tuple(float(r) for r in levels / levels.mean())


def engine_host_s(run: Steps, calibration: Steps) -> float:
    """The engine's own host work per step that a timed executor call (a calibration or profile
    step) does not include: scheduling, post-processing, events. Measured on the run's most
    frequent class that has calibration steps too: the median of its steps' host time less
    what its calibration steps' host times predict for them (0: no such class)."""
    names, counts = np.unique(run.classes, return_counts=True)
    for name in names[np.argsort(-counts)].astype(str).tolist():
        excess = _beyond_calibration(run, calibration, name, ("num_seqs",), MIN_OFFSET_STEPS)
        if excess is not None:
            return max(float(np.median(excess)), 0.0)
    return 0.0


def engine_token_s(run: Steps, calibration: Steps, engine_s: float) -> float:
    """The engine's own host work per prompt token scheduled, beyond ``engine_s`` a step: the
    scheduler's block allocation and hashing, the prompt's events, its input rows, all of which
    grow with the tokens a prefill schedules and none of which a timed executor call pays.
    Measured on the run's prefill steps of a class with calibration steps too (the most
    frequent): the median of their host time beyond what calibration predicts, less
    ``engine_s``, per prompt token (0: no such class; never negative)."""
    tokens_at = FEATURES.index("prefill_tokens")
    names, counts = np.unique(run.classes, return_counts=True)
    for name in names[np.argsort(-counts)].astype(str).tolist():
        if name not in PREFILL_CLASSES:
            continue
        excess = _beyond_calibration(run, calibration, name, ("num_seqs", "prefill_tokens"),
                                     FEW_OFFSET_STEPS)
        if excess is None:
            continue
        tokens = run.x[(run.classes == name) & np.isfinite(run.host), tokens_at]  # excess's rows
        keep = tokens > 0
        if keep.sum() < FEW_OFFSET_STEPS:
            continue
        return max(float(np.median((excess[keep] - engine_s) / tokens[keep])), 0.0)
    return 0.0


def _beyond_calibration(run: Steps, calibration: Steps, name: str, by: tuple[str, ...],
                        min_rows: int) -> np.ndarray | None:
    """The host time of the run's steps of class ``name`` beyond what a fit of its calibration
    steps' host times on ``by`` predicts for them (None: fewer than two calibration steps a
    feature, or than ``min_rows`` of the run's)."""
    cal = (calibration.classes == name) & np.isfinite(calibration.host)
    rows = (run.classes == name) & np.isfinite(run.host)
    if cal.sum() < 2 * len(by) or rows.sum() < min_rows:
        return None
    fit = fitting.fit_linear(calibration.x[cal], calibration.host[cal], by)
    return run.host[rows] - fit.predict(run.x[rows])


def host_stall_rate(run: Steps) -> float:
    """The share of the engine's host work lost to stalls (the recorder's staging and segment
    writes, the collector, the OS): over the run's most frequent class, the mean host time
    over the median, less one. A typical step pays none, the mean step this share."""
    names, counts = np.unique(run.classes, return_counts=True)
    if not len(names):
        return 0.0
    host = run.host[run.classes == names[np.argmax(counts)]]
    host = host[np.isfinite(host)]
    if len(host) < MIN_OFFSET_STEPS or float(np.median(host)) <= 0:
        return 0.0
    return max(float(host.mean() / np.median(host)) - 1.0, 0.0)


def _trimmed_mean(residuals: np.ndarray) -> float:
    lo, hi = np.quantile(residuals, [TRIM, 1 - TRIM])
    return float(residuals[(residuals >= lo) & (residuals <= hi)].mean())


@dataclass
class OverlapModel:
    """Overlap mode's host-time fits per class and the interval rule's offsets per launch mode
    and class."""

    host: dict[str, LinearFit]
    # Mode -> class -> seconds added to the rule; and how each was obtained, for reporting.
    offsets: dict[str, dict[str, float]] = field(default_factory=dict)
    offset_source: dict[str, dict[str, str]] = field(default_factory=dict)
    sync_s: float = 0.0  # a sequential step's sync latency
    source_steps: dict[str, int] = field(default_factory=dict)  # source steps per mode
    host_warmup_s: dict[str, float] = field(default_factory=dict)  # as CostModel.warmup_s
    selection: dict[str, Any] = field(default_factory=dict)
    heldout: dict[str, Any] = field(default_factory=dict)
    engine_s: float = 0.0  # the engine's work per step beyond an executor call (engine_host_s)
    engine_token_s: float = 0.0  # and per prompt token it schedules (engine_token_s)
    # Host stalls per second of host work (``host_stall_rate``): an eager step's device waits
    # for its launches, so it pays them in device time too.
    stall_rate: float = 0.0
    # An overlapped step's host time over its fit, by quantile (``host_spread``; (): its mean).
    spread: tuple[float, ...] = ()

    @classmethod
    def fit(cls, run: Steps, calibration: Steps, class_offsets: bool = True,
            engine_host: bool = True, host_stalls: bool = False,
            spread: bool = False) -> OverlapModel:
        """``run``: the run's steps (``time``: device time); ``calibration``: the calibration steps
        that record their wait for the device (so their host time: sizes the run never took).
        A class's first step is left out of the host fit and, far above it, charged once.
        ``engine_host``: each calibration step is charged the engine's own work around a step
        (``engine_host_s``) and per prompt token (``engine_token_s``), which a timed executor
        call lacks and every real step pays. ``spread``: overlapped steps priced over the
        source's spread of host times (``host_spread``)."""
        firsts = features.first_of_class(run.classes)
        later = run.rows(~firsts)
        engine_s = engine_host_s(later, calibration) if engine_host else 0.0
        token_s = engine_token_s(later, calibration, engine_s) if engine_host else 0.0
        if engine_s or token_s:
            charged = engine_s + token_s * calibration.x[:, FEATURES.index("prefill_tokens")]
            calibration = calibration.rows(np.ones(len(calibration), dtype=bool))
            calibration.host = calibration.host + charged
            calibration.interval = calibration.interval + charged
        fits, selection = fitting.fit_host(later.concat(calibration))
        steady = run.rows(~firsts & ~run.window)
        model = cls(fits, selection=selection, engine_s=engine_s, engine_token_s=token_s,
                    stall_rate=host_stall_rate(steady) if host_stalls else 0.0)
        predicted = model.host_times(run.x, run.classes)
        if spread:
            model.spread = host_spread(steady, predicted[~firsts & ~run.window])
        for row in np.flatnonzero(firsts):
            name = str(run.classes[row])
            others = (run.classes == name) & ~firsts
            if not others.any():
                continue
            # The same one-off rule as a first step's device time (fit.warmup_steps).
            extra = warmup.one_off_excess(float(predicted[row]), float(run.host[row]),
                                           predicted[others], run.host[others])
            if extra is not None:
                model.host_warmup_s[name] = extra
        model._fit_offsets(run, calibration, class_offsets)
        return model

    def _fit_offsets(self, run: Steps, calibration: Steps, class_offsets: bool = True) -> None:
        """Per class and mode, what the rule misses (``interval - rule(device, host)``): the
        trimmed mean over ``MIN_OFFSET_STEPS`` or more steps; else the median of
        ``FEW_OFFSET_STEPS`` or more besides its first (the run's own overhead around a step,
        which no calibration step shows); else, sequential, its calibration steps' or the other
        sequential steps' sync latency; overlapped, all overlapped steps' (0: too few).
        ``class_offsets`` False: every class the last two (``CostOptions.class_offsets``)."""
        residual = run.interval - intervals(run.time, run.host, run.overlapped, run.classes)
        cal_residual = calibration.interval - intervals(
            calibration.time, calibration.host, calibration.overlapped, calibration.classes)
        classes, overlapped, cal_classes = run.classes, run.overlapped, calibration.classes
        firsts = features.first_of_class(classes)
        sequential = ~overlapped
        if sequential.sum() >= MIN_OFFSET_STEPS:
            self.sync_s = _trimmed_mean(residual[sequential])
        elif len(cal_residual):
            self.sync_s = float(np.median(cal_residual))
        overall = (_trimmed_mean(residual[overlapped]) if overlapped.sum() >= MIN_OFFSET_STEPS
                   else 0.0)
        self.source_steps = {"sequential": int(sequential.sum()),
                             "overlapped": int(overlapped.sum())}
        for mode, rows_of_mode in zip(MODES, (sequential, overlapped)):
            self.offsets[mode], self.offset_source[mode] = {}, {}
            for name in STEP_CLASSES:
                rows = rows_of_mode & (classes == name)
                cal = cal_classes == name
                later = rows & ~firsts
                if not class_offsets:
                    value = self.sync_s if mode == "sequential" else overall
                    how = "one offset for every class (class_offsets off)"
                elif rows.sum() >= MIN_OFFSET_STEPS:
                    value = _trimmed_mean(residual[rows])
                    how = f"measured on {int(rows.sum())} steps"
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

    def host_fit(self, cls_name: str) -> LinearFit:
        """A class's host fit; for a class the source did not run, a related class's
        (``ClassSpec.host_fallbacks``), whose slopes are the shared ones anyway."""
        if cls_name in self.host:
            return self.host[cls_name]
        for other in features.CLASSES[cls_name].host_fallbacks:
            if other in self.host:
                return self.host[other]
        if not self.host:
            return LinearFit(0.0, (0.0,) * len(features.FEATURES), (), 0)
        return self.host[next(n for n in (*STEP_CLASSES, *self.host) if n in self.host)]

    def host_times(self, x: np.ndarray, classes: np.ndarray) -> np.ndarray:
        fits = {str(name): self.host_fit(str(name)) for name in np.unique(classes)}
        return fitting.host_times(fits, x, classes)

    def offset(self, mode: str, cls_name: str) -> float:
        return self.offsets.get(mode, {}).get(cls_name, 0.0)

    def intervals(self, device: np.ndarray, host: np.ndarray, overlapped: np.ndarray,
                  classes: np.ndarray) -> np.ndarray:
        offset = np.array([self.offset(MODES[int(flag)], str(name))
                           for flag, name in zip(overlapped, classes)])
        return intervals(device, host, overlapped, classes, offset, self.spread)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["host"] = {name: fit.to_dict() for name, fit in self.host.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OverlapModel:
        host = {name: LinearFit.from_dict(fit) for name, fit in data["host"].items()}
        return cls(**{**data, "host": host, "spread": tuple(data.get("spread", ()))})
