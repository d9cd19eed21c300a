"""A device profile (engine/profiling.py) as the step-time model's prior.

A source trace prices well the steps it ran; a profile times every step shape the model can take on
the device. ``ProfilePrior`` fits each class on the profile's rows (the same candidates and
selection as a trace's: ``fit.fit_all``; their features have a physical meaning: tokens for the
GEMMs' FLOPs and weight reads, ``prefill_attn_work`` for attention FLOPs, ``decode_kv_tokens`` for
KV bytes read, ``decode_longest_tokens`` for the attention kernel's last wave, sequences for
per-sequence work, the intercept and floor for per-launch costs), scales each class by what the
source's own steps of it took over what the profile predicts for them (another process, clock or
build on the same device), and prices a step where the source's fit does not reach: ``priced_by``
says which of the two prices a step, and whether it lies outside both.

The model's switches are ``options.CostOptions``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.profiling import DECODE_TABLES_OWN, ProfileError, load_profile, profile_key
from replay.whatif.cost import fit as fitting
from replay.whatif.cost.features import (
    CLASSES,
    FEATURES,
    LONGEST,
    POOLED,
    STEP_CLASSES,
    LinearFit,
    Steps,
    calibration_steps,
)
from replay.whatif.cost.host_speed import HostSpeedError, calibration_hosts, host_speed
from replay.whatif.cost.options import CostOptions

TRACE, PROFILE, OUTSIDE = "trace", "profile", "outside"
# The axes a class's range is checked along: its size and the decode context it reads.
CONTEXT = "decode_context_tokens"
# A scale outside these bounds says the profile is of another device or model: not applied.
SCALE_BOUNDS = (0.5, 2.0)
# A class's own scale needs this many of the source's steps (fewer: the overall one).
MIN_SCALE_STEPS = 8
# The profile's host work over the source's beyond this factor (either way) is worth a warning:
# an eager step's interval is its host's launches (docs/BENCHMARKS.md 7i).
HOST_WARNING_RATIO = 1.25
def read_profile(profile: str | Path | dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A profile and its name, from a file or as loaded; several files, comma-separated, are
    pooled (``merge_profiles``)."""
    if isinstance(profile, dict):
        return profile, str(profile.get("path", "a profile"))
    paths = profile_paths(str(profile))
    if len(paths) == 1:
        return load_profile(paths[0]), paths[0]
    return merge_profiles([load_profile(path) for path in paths], paths), str(profile)


PROFILE_SEPARATOR = ","  # PROFILE_A,PROFILE_B: several profiles of one setup, pooled


def profile_paths(text: str) -> list[str]:
    """The files a ``--profile`` argument names (comma-separated, spaces around them ignored)."""
    return [part.strip() for part in text.split(PROFILE_SEPARATOR) if part.strip()]
TIMINGS = ("interval_s", "duration_s", "wait_s", "interval_p10_s", "interval_p90_s")


def merge_profiles(profiles: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """One profile of several of the same setup (``key``): each point (label and launch mode)
    timed by the median of its timings over the profiles that timed it, so a row one profile
    timed slow by chance (the host's state, a clock) does not move the fit. A
    ``ProfileError`` where the setups differ."""
    keys = {json.dumps(p.get("key") or {}, sort_keys=True) for p in profiles}
    if len(keys) > 1:
        raise ProfileError(f"{', '.join(names)}: profiles of different setups cannot be "
                           f"pooled ({' / '.join(sorted(keys))})")
    points: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for data in profiles:
        for row in data["rows"]:
            points.setdefault((str(row["label"]), bool(row["graph_used"])), []).append(row)
    rows = []
    for timed in points.values():
        row = dict(timed[0])
        for name in TIMINGS:
            values = [float(r[name]) for r in timed if r.get(name) is not None]
            if values:
                row[name] = float(np.median(values))
        row["profiles"] = len(timed)
        rows.append(row)
    merged = {**profiles[0], "rows": rows, "path": PROFILE_SEPARATOR.join(names),
              "merged_from": list(names)}
    if any(p.get("decode_tables") != DECODE_TABLES_OWN for p in profiles):
        # One of them ran its shared-prefix rows over other tables: their medians say nothing.
        merged.pop("decode_tables", None)
    return merged


def profile_steps(profile: dict[str, Any], measured_host: bool, overhead_s: float,
                  kv_heads: int, causal: bool = False) -> Steps:
    """The profile's rows as fit rows (``features.calibration_steps``) of a model of
    ``kv_heads`` KV heads (the source's: a profile of another model is refused by its key).
    Its decodes over shared prefixes only where they ran over their own block tables
    (``decode_tables``): in an older profile they ran over an earlier point's, private ones.
    ``causal``: as ``CostOptions.causal_work``."""
    rows = profile["rows"]
    if profile.get("decode_tables") != DECODE_TABLES_OWN:
        rows = [row for row in rows if not row.get("prefix_groups")]
    return calibration_steps(rows, measured_host, overhead_s, kv_heads, causal)


def _ranges(x: np.ndarray, classes: np.ndarray) -> dict[str, dict[str, list[float]]]:
    """Per class, the [min, max] of its size and decode context over ``x``'s rows."""
    out: dict[str, dict[str, list[float]]] = {}
    for name in np.unique(classes).astype(str).tolist():
        if name not in CLASSES:
            continue
        rows = x[classes == name]
        axes = dict.fromkeys((CLASSES[name].size_feature, CONTEXT))
        out[name] = {axis: [float(rows[:, FEATURES.index(axis)].min()),
                            float(rows[:, FEATURES.index(axis)].max())] for axis in axes}
    return out


def _within(ranges: dict[str, list[float]] | None, step: Any) -> bool:
    if not ranges:
        return False
    return all(lo <= step[FEATURES.index(axis)] <= hi for axis, (lo, hi) in ranges.items())


def _profile_fits(rows: Steps, options: CostOptions, fraction: float,
                  routes: tuple[int, ...] = ()) -> dict[str, LinearFit]:
    """Each class's fit on the profile's rows alone (``routes``: ``fit.fit_all``'s)."""
    fits, _ = fitting.fit_all(rows, options.prefill_roofline, fraction, options.relative_roofline,
                              routes)
    fits.pop(POOLED, None)
    return fits


def _class_scales(fits: dict[str, LinearFit], source: Steps, enabled: bool
                  ) -> tuple[dict[str, float], float]:
    """Per class with at least ``MIN_SCALE_STEPS`` source steps, the median of those steps'
    time over what the profile's fit predicts for them (a ratio outside ``SCALE_BOUNDS`` is
    not taken); and for every other class the median over all those steps together (1 where
    there are none), so a class of a few host-bound eager steps does not set it."""
    scale: dict[str, float] = {}
    ratios: list[np.ndarray] = []
    for cls_name, fit in fits.items():
        mask = source.classes == cls_name
        if enabled and mask.sum() >= MIN_SCALE_STEPS:
            ratio = source.time[mask] / fit.predict(source.x[mask])
            if SCALE_BOUNDS[0] <= float(np.median(ratio)) <= SCALE_BOUNDS[1]:
                scale[cls_name] = float(np.median(ratio))
                ratios.append(ratio)
    overall = float(np.median(np.concatenate(ratios))) if ratios else 1.0
    return scale, overall


@dataclass
class ScaledProfile:
    """A profile read against one source, once for the pooled rows and the prior alike: its rows
    as fit rows (``rows``, as timed), the same rows as its class fits saw them (``fitted``), the
    fits, their shared-read fraction, and each class's ratio of the source's steps to its fit
    (``_class_scales``: ``scale``, the ``overall`` one for the other classes)."""

    rows: Steps
    fitted: Steps
    fits: dict[str, LinearFit]
    fraction: float
    scale: dict[str, float]
    overall: float

    @classmethod
    def of(cls, profile: dict[str, Any], source: Steps, options: CostOptions,
           measured_host: bool, overhead_s: float, kv_heads: int,
           routes: tuple[int, ...] = ()) -> ScaledProfile:
        """``profile`` against ``source`` (the source's own rows), its rows read as the
        source's are (``measured_host``: device time and host work, else intervals);
        ``routes``: the source's decode routes (``decode_routes``)."""
        rows = profile_steps(profile, measured_host, overhead_s, kv_heads, options.causal_work)
        fitted = rows.rows(np.ones(len(rows), dtype=bool))  # a copy: the fit may zero a feature
        if not options.longest_program:
            fitted.x[:, FEATURES.index(LONGEST)] = 0.0
        fraction = options.shared_read_fraction(fitted)
        fits = _profile_fits(fitted, options, fraction, routes)
        scale, overall = _class_scales(fits, source, options.profile_scale)
        return cls(rows, fitted, fits, fraction, scale, overall)

    def pooled_rows(self) -> Steps:
        """The profile's rows to pool with the source's own (``profile_mode=pooled``), each
        row's time scaled by its class's ratio (with ``profile_scale`` off, as timed): a profile
        of another process, clock or day joins the source's steps at the source's speed."""
        out = self.rows.rows(np.ones(len(self.rows), dtype=bool))
        factor = [self.scale.get(c, self.overall) for c in out.classes.astype(str).tolist()]
        out.time = out.time * np.array(factor, dtype=float)
        return out


def _scaled(fit: LinearFit, scale: float) -> LinearFit:
    return replace(fit, intercept=fit.intercept * scale, coef=tuple(c * scale for c in fit.coef),
                   floor=fit.floor * scale, prefill_longest_s=fit.prefill_longest_s * scale,
                   route_s=tuple(s * scale for s in fit.route_s))


@dataclass
class ProfilePrior:
    """The profile's class fits (scaled to the source), the ranges of both, and the profile's
    key (``engine.profiling.profile_key``)."""

    path: str
    key: dict[str, Any]
    fits: dict[str, LinearFit]
    scale: dict[str, float] = field(default_factory=dict)
    profile_range: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    trace_range: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    mode: str = "pooled"
    # What differs between the profile's key and the source's (device, model, dtype, ...).
    mismatch: dict[str, list[Any]] = field(default_factory=dict)
    shared_read_fraction: float = 1.0  # its fits' (``fit.shared_read_fraction``)
    # The profile's host work over the source's, on the eager shapes both the profile and the
    # source's start-up calibration timed (``host_speed``; None: too few in common).
    host_ratio: float | None = None
    host_shapes: int = 0

    @classmethod
    def fit(cls, profile: dict[str, Any], name: str, read: ScaledProfile, own_fits: set[str],
            options: CostOptions, header: dict[str, Any], source: Steps) -> ProfilePrior:
        """``read``: the profile read against ``source``, the source's own rows (whose ranges
        say which steps lie within the source's); ``own_fits``: the classes the source fitted
        itself; ``header``: the source trace's."""
        scale, overall = read.scale, read.overall
        scaled = {c: _scaled(f, scale.get(c, overall)) for c, f in read.fits.items()}
        trace = _ranges(source.x, source.classes) if options.profile_mode != "profile" else {}
        key = dict(profile.get("key") or {})
        source_key = profile_key(header.get("executor") or {}, key.get("engine_version", ""))
        mismatch = {k: [key.get(k), v] for k, v in source_key.items()
                    if v is not None and key.get(k) is not None and key.get(k) != v}
        try:
            host = host_speed(calibration_hosts(header.get("calibration") or []),
                              profile["rows"], "the profile")
        except HostSpeedError:
            host = None
        return cls(name, key, scaled, scale, _ranges(read.fitted.x, read.fitted.classes),
                   {c: r for c, r in trace.items() if c in own_fits}, options.profile_mode,
                   mismatch, read.fraction, host.ratio if host else None,
                   host.shapes if host else 0)

    def priced_by(self, cls_name: str, step: Any) -> str:
        """Which prices a step (``TRACE``, ``PROFILE``), or ``OUTSIDE`` where neither's range
        holds it (then priced by the source's fit where it has one, else the profile's). Pooled:
        one fit of both prices every step; ``TRACE`` where the step lies within the source's
        range, ``PROFILE`` within the profile's only."""
        if _within(self.trace_range.get(cls_name), step):
            return TRACE
        if cls_name in self.fits and _within(self.profile_range.get(cls_name), step):
            return PROFILE
        return OUTSIDE

    def prices(self, cls_name: str, step: Any) -> bool:
        """Whether the profile's fit prices this step (rather than the source's)."""
        return self._profile_prices(cls_name, self.priced_by(cls_name, step))

    def _profile_prices(self, cls_name: str, where: str) -> bool:
        """``prices`` of a step of ``cls_name`` that ``priced_by`` puts ``where``."""
        if self.mode == "pooled" or cls_name not in self.fits:
            return False
        return where == PROFILE or (where == OUTSIDE and cls_name not in self.trace_range)

    def pricing(self, x: np.ndarray, classes: np.ndarray) -> dict[str, dict[str, int]]:
        """Per class, how many of these steps each source prices (``priced_by``)."""
        out: dict[str, dict[str, int]] = {}
        for step, name in zip(x.tolist(), classes.astype(str).tolist()):
            counts = out.setdefault(name, {TRACE: 0, PROFILE: 0, OUTSIDE: 0})
            counts[self.priced_by(name, step)] += 1
        return out

    def warnings(self, x: np.ndarray, classes: np.ndarray) -> list[str]:
        """One line saying what priced these steps, and one per class with steps outside
        both ranges."""
        pricing = self.pricing(x, classes)
        trace = sum(c[TRACE] for c in pricing.values())
        profile = sum(c[PROFILE] for c in pricing.values())
        device = f"({self.key.get('device')}, {self.key.get('architecture')})"
        if self.mode == "pooled":
            lines = [f"priced by one fit of the source's steps pooled with the profile "
                     f"{self.path}'s rows {device}: {trace} steps within the source's range, "
                     f"{profile} within the profile's only"]
        else:  # what prices each step (``prices``), those outside both ranges included
            profile = sum(n for name, counts in pricing.items() for where, n in counts.items()
                          if self._profile_prices(name, where))
            lines = [f"priced by the source's fits on {len(classes) - profile} steps and the "
                     f"profile {self.path} {device} on {profile}"]
        if self.mismatch:
            lines.append("the profile is not of the source's setup: " + ", ".join(
                f"{k} {theirs} (source {ours})" for k, (theirs, ours) in self.mismatch.items()))
        ratio = self.host_ratio
        if ratio is not None and not 1 / HOST_WARNING_RATIO <= ratio <= HOST_WARNING_RATIO:
            lines.append(f"the profile's host did its eager steps' host work at x{ratio:.2f} of "
                         f"the source's (the {self.host_shapes} eager shapes the source's "
                         "start-up calibration timed too): its rows carry that host into the "
                         "eager steps' prices")
        for name in STEP_CLASSES:
            outside = pricing.get(name, {}).get(OUTSIDE, 0)
            if outside and self.mode == "profile" and name not in self.fits:
                # (profile mode keeps no source range: these may be the source's own steps)
                lines.append(f"{outside} {name} steps: the profile has no fit of {name} steps "
                             "(no rows of them, or too few), so the source's fits price them "
                             "(profile_mode=profile)")
            elif outside:
                lines.append(f"{outside} {name} steps lie outside both the source's and the "
                             "profile's range: extrapolated")
        return lines

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fits"] = {name: fit.to_dict() for name, fit in self.fits.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProfilePrior:
        fits = {name: LinearFit.from_dict(f) for name, f in data["fits"].items()}
        return cls(**{**data, "fits": fits})
