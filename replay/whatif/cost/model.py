"""The step-time model: how long one engine step takes, from the batch features it records.

``CostModel.fit`` fits each step class on a trace's steps and calibration steps (``fit``);
``CostModel.predict`` prices one step as a ``StepTime(device_s, host_s, interval_s)``, the interval
being the wall time it adds to a run, by the one rule for how device and host time combine
(``interval``). Two modes, by what the trace measured:
- *interval* mode (no ``host_s``: a version-1 trace): the class fits are of the interval itself.
- *overlap* mode (each step's host work ``host_s``, and ``overlapped``: launched while the
  previous step ran): the class fits are of device time; ``OverlapModel`` fits host time and the
  offsets the rule misses systematically, per class and launch mode. So a target that overlaps
  another fraction of its steps than the source is priced by its own launch decisions, which the
  engine takes from scheduler state alone and a simulation reproduces.
Every fit reports its error on held-out steps; ``save``/``load`` keep a model as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from replay.metrics import has_timings
from replay.recorded import RecordedEvents
from replay.whatif.cost import explain, features, graphs, warmup
from replay.whatif.cost import fit as fitting
from replay.whatif.cost.arrivals import AddCost, fit_add_cost
from replay.whatif.cost.decode_attention import DEFAULT_KV_HEADS, kv_heads_of
from replay.whatif.cost.features import MIN_STEP_S, MODES, LinearFit, Steps
from replay.whatif.cost.host_speed import (
    HostSpeed,
    HostSpeedError,
    calibration_hosts,
    host_speed,
    host_terms_scaled,
)
from replay.whatif.cost.options import CostOptions, decode_routes
from replay.whatif.cost.overlap import OverlapModel, interval
from replay.whatif.cost.profile import ProfilePrior, ScaledProfile, read_profile
from replay.whatif.cost.saved import MODEL_SHAPES, CostModelError, read_saved
from tracing.header import recorded_device

MODEL_VERSION = 12  # of the saved JSON (``to_dict``); a file of another version is refused


def recorded_model(header: Mapping[str, Any]) -> str:
    """The model a trace ran, in words its step times depend on ("Qwen3ForCausalLM, 596M
    parameters, bfloat16"), never its path (the same checkpoint lives elsewhere on another
    machine); empty where the header does not say."""
    model = header.get("model")
    if not isinstance(model, Mapping):
        return str(model or "")
    params = model.get("num_params")
    parts = [str(model.get("architecture") or "a model"),
             f"{params / 1e6:,.0f}M parameters" if isinstance(params, int | float) else
             f"{model.get('num_layers', '?')} layers, hidden size {model.get('hidden_size', '?')}",
             str(model.get("dtype") or "")]
    return ", ".join(p for p in parts if p)


@dataclass(slots=True)
class StepTime:
    """A step's predicted device time, host time (the engine's own CPU work; 0 in interval mode)
    and the interval it adds to the run."""

    device_s: float
    host_s: float
    interval_s: float


@dataclass(frozen=True, slots=True)
class _ClassTimes:
    """What ``CostModel.predict`` prices one class by (resolved once per class)."""

    device: LinearFit
    parallel: bool  # eager: max(device, host) when sequential too
    warmup_s: float
    host: LinearFit | None = None  # None: interval mode
    sequential_s: float = 0.0
    overlapped_s: float = 0.0
    host_warmup_s: float = 0.0
    stall_rate: float = 0.0  # ``OverlapModel.stall_rate``
    spread: tuple[float, ...] = ()  # ``OverlapModel.spread``


@dataclass
class CostModel:
    """Per-class fits plus how the source run padded decode batches and prefill tokens for CUDA
    graphs. ``overlap`` None: interval mode, ``fits`` are of step intervals; else overlap mode:
    ``fits`` are of device time, ``overlap`` holds the host-time fits and the rule's offsets."""

    fits: dict[str, LinearFit]
    source: str = ""
    heldout: dict[str, Any] = field(default_factory=dict)
    graph_sizes: list[int] = field(default_factory=list)  # decode; empty: the source ran none
    # Class -> seconds the first step of that class took beyond the fit (JIT compilation, lazy
    # allocation): charged once per run, kept out of the per-step fit.
    warmup_s: dict[str, float] = field(default_factory=dict)
    # Class -> the range its fit rests on (``explain.class_coverage``), and how it was chosen.
    coverage: dict[str, dict[str, Any]] = field(default_factory=dict)
    selection: dict[str, dict[str, Any]] = field(default_factory=dict)
    window_steps: int = 0
    overlap: OverlapModel | None = None
    # Token counts the source captured prefill graphs for, ascending (empty: none), and the most
    # sequences one graph prefill takes.
    prefill_graph_sizes: list[int] = field(default_factory=list)
    prefill_graph_max_seqs: int = 0
    prior: ProfilePrior | None = None  # a device profile pricing what the source did not run
    kv_heads: int = DEFAULT_KV_HEADS  # the model's (``decode_attention.longest_program_tokens``)
    # What a decode's re-read of a block another row reads too costs, as a fraction of a read
    # from memory (``fit.shared_read_fraction``); below 1 (its or its prior's) the simulator
    # counts each step's distinct blocks (``shared_kv``).
    shared_read_fraction: float = 1.0
    shared_kv: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # ``CostOptions`` changed from default
    add: AddCost = field(default_factory=AddCost)  # the live loop's host time to add a request
    # The source's start-up calibration host work per shape (``host_speed.calibration_hosts``),
    # and the host the model prices on where not the source's (``on_host``).
    host_calibration: dict[str, float] = field(default_factory=dict)
    device: str = ""  # the timing source's device (``tracing.header.recorded_device``)
    model_name: str = ""  # the timing source's model (``recorded_model``); "" where unknown
    host: HostSpeed | None = None
    _times: dict[str, _ClassTimes] = field(default_factory=dict, init=False, repr=False,
                                           compare=False)
    _prior_times: dict[str, _ClassTimes] = field(default_factory=dict, init=False, repr=False,
                                                 compare=False)

    # --- fitting --------------------------------------------------------------------------------
    @classmethod
    def fit(cls, events: RecordedEvents, source: str = "", profile: Any = None,
            options: CostOptions | None = None) -> CostModel:
        """Fit from a recording with measured step times; held-out error in ``heldout``.
        ``profile``: a device profile (a path or as loaded) pricing steps beyond the source's
        range (``ProfilePrior``); ``options``: the mechanisms used (``CostOptions``)."""
        options = options or CostOptions()
        name = source or "the trace"
        if not has_timings(events):
            why = "recorded without a model" if events.num_steps else "it ran no step"
            raise CostModelError(f"{name} has no measured step times ({why})")
        host_times = _fits_host(events, options)
        add = fit_add_cost(events) if options.request_add else AddCost()
        steps = features.steps_of(events, host_times, add=add, causal=options.causal_work)
        own = steps.rows(~steps.is_calibration)
        loaded = read_profile(profile) if profile is not None else None
        pooling = loaded is not None and options.profile_mode == "pooled"
        # With a pooled profile the run's early steps stay in: its rows cover the shapes the
        # window guards, and a reference's prefills, all before its first decode, are the
        # source's only long ones (BENCHMARKS 7q).
        leading = warmup.warmup_window(own) if options.warmup_window and not pooling else 0
        own.window = np.arange(len(own)) < leading
        warm, warmup_s = (warmup.warmup_steps(own) if options.warmup_steps
                          else (np.zeros(len(own), dtype=bool), {}))
        calibration = steps.rows(steps.is_calibration & options.calibration)
        kv_heads = kv_heads_of(events.header)
        overhead_s = features.engine_overhead_s(events, add)
        # The source's own rows, before any profile rows join them (their ranges: priced_by).
        source_rows = fitting.sharing_nothing(own.rows(~warm).concat(calibration))
        routes = decode_routes(events.header) if options.decode_routes else ()
        read = (ScaledProfile.of(loaded[0], source_rows, options, host_times, overhead_s,
                                 kv_heads, routes) if loaded is not None else None)
        if pooling:
            assert read is not None  # pooling: a profile was given
            calibration = calibration.concat(read.pooled_rows())
        fitted = own.rows(~warm).concat(calibration)
        if not options.longest_program:
            fitted.x[:, features.FEATURES.index(features.LONGEST)] = 0.0
        weighed = fitted
        if pooling and options.run_weight:
            rest = fitted.rows(fitted.is_calibration)  # start-up and profile rows
            weighed = fitting.weigh_run(fitted.rows(~fitted.is_calibration), rest).concat(rest)
        fraction = options.shared_read_fraction(fitted)
        # Steps that re-read shared blocks measure that fraction only (``fit.fit_all``).
        fitted = fitting.sharing_nothing(fitted)
        calibration = fitting.sharing_nothing(calibration)
        fits, reports = fitting.fit_all(weighed, options.prefill_roofline, fraction,
                                        options.relative_roofline, routes)
        if not fits:
            raise CostModelError(f"{name} has too few steps to fit a model ({len(own)} "
                                 "timed); give --timing-from a trace (or MODEL.json) of more")
        prefill_sizes, prefill_max_seqs = graphs.source_prefill_graphs(events)
        model = cls(fits, source=source, graph_sizes=graphs.observed_graph_sizes(events),
                    warmup_s=warmup_s, selection=reports, window_steps=leading,
                    prefill_graph_sizes=prefill_sizes, prefill_graph_max_seqs=prefill_max_seqs,
                    options=options.changed(), kv_heads=kv_heads,
                    shared_read_fraction=fraction, shared_kv=fraction < 1.0,
                    add=add,
                    host_calibration=calibration_hosts(events.header.get("calibration") or []),
                    device=recorded_device(events.header),
                    model_name=recorded_model(events.header))
        for cls_name, report in reports.items():
            mask = fitted.classes == cls_name
            model.coverage[cls_name] = explain.class_coverage(
                cls_name, fitted.x[mask], ~fitted.window[mask], fits[cls_name], report)
        model.heldout = _device_heldout(fitted, fraction)
        if loaded is not None:
            model.prior = ProfilePrior.fit(loaded[0], loaded[1], read, set(reports), options,
                                           events.header, source_rows)
            model.shared_kv |= model.prior.shared_read_fraction < 1.0
        if host_times:
            run = own.rows(~warm)
            timed = calibration.rows(np.isfinite(calibration.host))
            model.overlap = OverlapModel.fit(run, timed, options.class_offsets,
                                             options.engine_host, options.host_stalls,
                                             options.host_spread)
            model.overlap.heldout = _overlap_heldout(run, timed, calibration, fraction,
                                                     options.host_spread)
        return model

    # --- prediction -----------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return "interval" if self.overlap is None else "overlap"

    @property
    def causal_work(self) -> bool:
        """Whether the fits price prefill attention work counted causally (``CostOptions``):
        a step's features must then be counted so too (``linear.causal_work``). ``options``
        holds what differs from the defaults: absent, the default."""
        return bool(self.options.get("causal_work", CostOptions.causal_work))

    def device_fit(self, cls_name: str) -> LinearFit:
        """The fit a class is priced by: its own, else related ones (``features.class_fit``)."""
        return features.class_fit(self.fits, cls_name)

    def fitted_times(self, x: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """What the class fits predict for each step: intervals (interval mode) or device times
        (overlap mode); one-off first-step costs not included."""
        out = np.empty(len(x))
        for name in np.unique(classes):
            mask = classes == name
            out[mask] = self.device_fit(str(name)).predict(x[mask])
        return out

    def predict(self, step: Sequence[float], cls_name: str, overlapped: bool = False,
                first: bool = False) -> StepTime:
        """One step's times: ``step``, its features (``features.StepFeatures``),
        its class, whether it was launched overlapped, and whether it is the run's first of its
        class (which pays the source's one-off costs). Plain floats: the simulator calls this
        once per step."""
        times = self._times.get(cls_name) or self._class_times(cls_name)
        if self.prior is not None and self.prior.prices(cls_name, step):
            times = self._prior_times.get(cls_name) or self._class_times(cls_name, self.prior)
        device = max(times.device.linear_at(step), times.device.floor, MIN_STEP_S)
        if first:
            device += times.warmup_s
        if times.host is None:
            return StepTime(device, 0.0, device)
        host = max(times.host.linear_at(step), 0.0)
        if times.parallel:  # an eager step's kernels wait for the host's stalled launches
            device += times.stall_rate * host
        if first:
            host += times.host_warmup_s
        if overlapped:
            return StepTime(device, host, interval(device, host, True, times.overlapped_s,
                                                   times.spread))
        return StepTime(device, host, interval(device, host, times.parallel, times.sequential_s))

    def _class_times(self, cls_name: str, prior: ProfilePrior | None = None) -> _ClassTimes:
        """What prices a class: the source's fits, or with ``prior`` the profile's device fit
        (host time and offsets stay the source's)."""
        device = prior.fits[cls_name] if prior is not None else self.device_fit(cls_name)
        times = _ClassTimes(device, cls_name in features.EAGER_CLASSES,
                            self.warmup_s.get(cls_name, 0.0))
        if self.overlap is not None:
            overlap = self.overlap
            times = _ClassTimes(
                times.device, times.parallel, times.warmup_s, host=overlap.host_fit(cls_name),
                sequential_s=overlap.offset("sequential", cls_name),
                overlapped_s=overlap.offset("overlapped", cls_name),
                host_warmup_s=overlap.host_warmup_s.get(cls_name, 0.0),
                stall_rate=overlap.stall_rate, spread=tuple(overlap.spread))
        (self._times if prior is None else self._prior_times)[cls_name] = times
        return times

    def on_host(self, rows: Sequence[Mapping[str, Any]], name: str = "the target") -> CostModel:
        """This model priced on the host whose start-up calibration ``rows`` are (a trace
        header's ``calibration``): every host term times ``host_speed`` (``host_terms_scaled``),
        device terms unchanged; a model priced on another host already is rescaled from that
        host's terms. A ``HostSpeedError`` where the calibrations cannot measure it."""
        _check_host_source(self.overlap is not None, self.host_calibration, self.source)
        speed = host_speed(self.host_calibration, rows, name)
        k = speed.ratio / (self.host.ratio if self.host is not None else 1.0)
        overlap, add = host_terms_scaled(self.overlap, self.add, k)
        return replace(self, overlap=overlap, add=add, host=speed)

    @staticmethod
    def check_on_host(events: RecordedEvents, rows: Sequence[Mapping[str, Any]], name: str,
                      source: str = "", options: CostOptions | None = None) -> None:
        """Before the fitting (slow on a long trace): the ``HostSpeedError`` that
        ``on_host(rows, name)`` would raise on ``fit(events, source, options=options)``."""
        calibration = calibration_hosts(events.header.get("calibration") or [])
        _check_host_source(_fits_host(events, options or CostOptions()), calibration, source)
        host_speed(calibration, rows, name)

    # --- words (``explain``) ----------------------------------------------------------------------
    def fallback(self, cls_name: str) -> str:
        """What a class the source has no fit for is priced from, in words ("": its own)."""
        return explain.fallback_words(cls_name, features.resolve(self.fits, cls_name))

    def caveats(self) -> list[str]:
        """What the source trace cannot identify, one line each."""
        return explain.caveats(self)

    def coverage_warnings(self, target: RecordedEvents) -> list[str]:
        """Where ``target``'s steps (a simulation's or a recording's) lie well outside the
        source's range for their class, so that a prediction there may be off; and why."""
        x, classes = features.feature_matrix(target, causal=self.causal_work)
        if self.prior is not None:
            return self.prior.warnings(x, classes)
        return explain.target_warnings(self, x, classes)

    def describe(self, target: RecordedEvents | None = None) -> str:
        """The model in a few lines (``explain.describe``)."""
        return explain.describe(self, target)

    # --- storage --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": MODEL_VERSION,
                               "target": "interval" if self.overlap is None else "device+host"}
        out.update({f.name: getattr(self, f.name) for f in fields(self) if f.init})
        out["fits"] = {name: fit.to_dict() for name, fit in self.fits.items()}
        out["overlap"] = self.overlap.to_dict() if self.overlap is not None else None
        out["prior"] = self.prior.to_dict() if self.prior is not None else None
        out["add"] = self.add.to_dict()
        out["host"] = asdict(self.host) if self.host is not None else None
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """A model ``save`` wrote; a ``CostModelError`` naming the field for anything else
        (``saved.read_saved``)."""
        data = read_saved(path, MODEL_VERSION, cls, MODEL_SHAPES)
        fits = {name: LinearFit.from_dict(f) for name, f in data.pop("fits").items()}
        overlap, prior = data.pop("overlap", None), data.pop("prior", None)
        host = data.pop("host", None)
        return cls(fits, overlap=OverlapModel.from_dict(overlap) if overlap else None,
                   prior=ProfilePrior.from_dict(prior) if prior else None,
                   add=AddCost.from_dict(data.pop("add", {})),
                   host=HostSpeed(**host) if host else None, **data)


def _device_heldout(fitted: Steps, shared_reads: float = 1.0) -> dict[str, Any]:
    """The error on the held-out steps of the class fits refitted without them."""
    test = fitting.holdout_mask(fitted.classes)
    if not test.any():
        return {}
    train_fits, _ = fitting.fit_all(fitted.rows(~test), shared_reads=shared_reads)
    if not train_fits:
        return {}
    predicted = CostModel(train_fits).fitted_times(fitted.x[test], fitted.classes[test])
    actual = fitted.time[test]
    return {**fitting.class_errors(predicted, actual, fitted.classes[test]),
            "all": fitting.errors(predicted, actual)}


def _fits_host(events: RecordedEvents, options: CostOptions) -> bool:
    """Whether ``fit`` fits host times (overlap mode): measured, and not switched off."""
    return bool(options.overlap and features.has_host_times(events))


def _check_host_source(host_times: bool, calibration: Mapping[str, float], source: str) -> None:
    """A source is priced on another host by its host terms and eager calibration (on_host)."""
    if not host_times or not calibration:
        raise HostSpeedError(f"{source or 'the source'}: no host times or eager "
                             "start-up calibration to price another host from")


def _overlap_heldout(run: Steps, timed: Steps, calibration: Steps, shared_reads: float = 1.0,
                     spread: bool = False) -> dict[str, Any]:
    """Held-out errors of the host fits and intervals: the run's held-out steps priced as the
    simulator does, by device fits, host fits and offsets refitted without them."""
    test = fitting.holdout_mask(run.classes)
    train = ~test
    if not (test.any() and train.any()):
        return {}
    device_fits, _ = fitting.fit_all(run.rows(train).concat(calibration),
                                     shared_reads=shared_reads)
    if not device_fits:
        return {}
    model = OverlapModel.fit(run.rows(train), timed, spread=spread)
    x, classes, overlapped = run.x[test], run.classes[test], run.overlapped[test]
    host_pred = model.host_times(x, classes)
    device_pred = CostModel(device_fits).fitted_times(x, classes)
    predicted = model.intervals(device_pred, host_pred, overlapped, classes)
    report: dict[str, Any] = {"host": fitting.class_errors(host_pred, run.host[test], classes),
                              "interval": {}}
    for mode, flag in zip(MODES, (False, True)):
        mask = overlapped == flag
        if mask.any():
            report["interval"][mode] = fitting.errors(predicted[mask], run.interval[test][mask])
    report["interval"]["all"] = fitting.errors(predicted, run.interval[test])
    return report
