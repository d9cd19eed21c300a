"""The step-time model in words: what it was fitted on, how well, and what it cannot know.

A fit is only as good as the range of steps it saw. Per class the model keeps the range of the
class's size (``class_coverage``: prompt tokens for eager prefill and mixed steps, padded tokens
for graph prefills, sequences for decode steps) and whether an eager class's launch floor was
identified.
``caveats`` says what the source cannot identify; ``target_warnings`` where a target's steps (a
simulation's, or a recording's) lie well outside the source's range, so that a prediction
carries its own caveat; ``fallback_words`` what a class without a fit of its own is priced from.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replay.whatif.cost.features import (
    CLASSES,
    COMPOSITE,
    EAGER_CLASSES,
    FEATURES,
    GRAPH_FROM_EAGER,
    MODES,
    POOLED,
    STEP_CLASSES,
)
from replay.whatif.cost.fit import LinearFit
from replay.whatif.cost.roofline import PREFILL_CLASSES

# "Well outside" the source's range: below half its smallest or above twice its largest size.
OUT_OF_RANGE_FACTOR = 2.0
UNITS = {"prefill_tokens": "tokens", "num_seqs": "sequences", "padded_tokens": "padded tokens"}
NAME_WIDTH = max(len(name) for name in CLASSES)  # reports align a column of class names


def class_coverage(name: str, x: np.ndarray, steady: np.ndarray, fit: LinearFit,
                   report: dict[str, Any]) -> dict[str, Any]:
    """The range one class's fit rests on (``x``: its steps; ``steady``: those outside the
    warm-up window)."""
    size = CLASSES[name].size_feature
    s = x[:, FEATURES.index(size)]
    return {
        "size": size,
        "min": float(s.min()),
        "max": float(s.max()),
        "steady_max": float(s[steady].max()) if steady.any() else None,
        "steps": int(len(s)),
        "window_steps": int((~steady).sum()),
        "floor_known": fit.floor > 0 or name not in EAGER_CLASSES,
    }


def fallback_words(cls_name: str, key: str) -> str:
    """What a class is priced from, given the fit it resolves to (``model.resolve``), in words
    ("": its own fit)."""
    if key == cls_name:
        return ""
    if key == COMPOSITE:
        return "the prefill fit plus the decode fits' slopes"
    if key == GRAPH_FROM_EAGER:
        return "the eager prefill fit's compute part at the padded token count (no launch floor)"
    if cls_name == "prefill" and key == "prefill_graph":
        return "the prefill_graph fit (no launch floor: may be low)"
    return f"the {key} fit"


def _size(value: float, size: str) -> str:
    return f"{value:,.0f} {UNITS.get(size, size)}"


def _heldout_words(err: dict[str, Any] | None) -> str:
    if not err:
        return ""
    return (f"held-out MAPE {err['mape_pct']:.1f}% on {err['n']} steps, "
            f"sum {err['sum_error_pct']:+.2f}%")


def coverage_caveats(coverage: dict[str, dict[str, Any]]) -> list[str]:
    """What the source's range of steps cannot identify, one line each."""
    lines = []
    for name, cov in coverage.items():
        size = cov["size"]
        if not cov["floor_known"] and cov["max"] < OUT_OF_RANGE_FACTOR * cov["min"]:
            # Not even a fixed cost is identified: every step had about the same size.
            lines.append(
                f"{name}: its {cov['steps']} steps all had between {cov['min']:,.0f} and "
                f"{_size(cov['max'], size)}, none on an eager launch floor: the floor is unknown "
                "and much smaller steps are predicted from the compute slope alone (may be low)"
            )
    return lines


def overlap_caveats(overlap: Any) -> list[str]:
    """Offsets the source could not measure, for the classes it ran (only decodes are ever
    launched overlapped). ``overlap``: a ``model.OverlapModel``."""
    lines = []
    for name in STEP_CLASSES:
        if name not in overlap.host:
            continue
        how = overlap.offset_source.get("sequential", {}).get(name, "")
        if how.startswith("derived"):
            lines.append(
                f"{name}: too few sequential steps in the source to measure their offset: "
                f"{1e3 * overlap.offset('sequential', name):+.3f} ms ({how})")
        how = overlap.offset_source.get("overlapped", {}).get(name, "")
        if name.startswith("decode") and not how.startswith("measured"):
            lines.append(
                f"{name}: too few overlapped steps in the source to measure their offset: "
                f"{1e3 * overlap.offset('overlapped', name):+.3f} ms (from {how})")
    return lines


def caveats(model: Any) -> list[str]:
    """What the source trace cannot identify (``model``: a ``CostModel``)."""
    overlap = overlap_caveats(model.overlap) if model.overlap is not None else []
    graphs = []
    if model.prefill_graph_sizes and "prefill_graph" not in model.fits:
        graphs.append("prefill_graph: the source captured prefill CUDA graphs but no step "
                      "it timed ran through one: a graph prefill is priced from "
                      f"{model.fallback('prefill_graph')}")
    return coverage_caveats(model.coverage) + overlap + graphs


def target_warnings(model: Any, x: np.ndarray, classes: np.ndarray) -> list[str]:
    """Where a target's steps (``x``, ``classes``) lie well outside the range of a
    ``CostModel``'s source for their class."""
    lines = []
    for name in sorted(set(np.unique(classes).astype(str))):
        rows = classes == name
        count = int(rows.sum())
        cov = model.coverage.get(name)
        if name not in model.fits or name == POOLED or cov is None:
            source = model.fallback(name) or "a related class's fit"
            lines.append(f"{count} {name} steps: the source has none of its own; predicted from "
                         f"{source}")
            continue
        size = cov["size"]
        s = x[rows, FEATURES.index(size)]
        small = s < cov["min"] / OUT_OF_RANGE_FACTOR
        if small.any() and not cov["floor_known"]:
            lines.append(
                f"{int(small.sum())} of {count} {name} steps much smaller than any in the source "
                f"(down to {_size(s.min(), size)}; the source's smallest had "
                f"{_size(cov['min'], size)}): eager launch floor unknown, prediction may be low"
            )
        large = s > cov["max"] * OUT_OF_RANGE_FACTOR
        if large.any():
            lines.append(
                f"{int(large.sum())} of {count} {name} steps much larger than any in the source "
                f"(up to {_size(s.max(), size)}; the source's largest had "
                f"{_size(cov['max'], size)}): cost extrapolated"
            )
    return lines


def overlap_lines(overlap: Any) -> list[str]:
    """The host fits, offsets and interval error of a ``model.OverlapModel``."""
    fits = [(name, overlap.host[name]) for name in STEP_CLASSES if name in overlap.host]
    shared = fits[0][1] if fits else None
    slopes = ", ".join(f"{1e6 * shared.coef[FEATURES.index(f)]:.3f} us x {f}"
                       for f in shared.features if f != "prefill_tokens"
                       ) if shared is not None else ""
    per_token = shared is not None and "prefill_tokens" in shared.features
    lines = ["  host time per step (the engine's own CPU work, fitted on host_s): a constant "
             f"per class + {slopes or 'no slope'}"
             f"{' + a per-token slope per class' if per_token else ''} (chosen by held-out "
             "error)"]
    held = overlap.heldout.get("host", {})
    tokens = FEATURES.index("prefill_tokens")
    for name, fit in fits:
        own = (f" + {1e9 * fit.coef[tokens]:.1f} ns x prefill_tokens"
               if per_token and name in PREFILL_CLASSES else "")
        lines.append(f"    {name:<{NAME_WIDTH}} {fit.samples:>6} steps  "
                     f"{1e3 * fit.intercept:.3f} ms{own}  "
                     f"{_heldout_words(held.get(name))}".rstrip())
    if overlap.engine_s or overlap.engine_token_s:
        lines.append(f"  calibration and profile rows charged the engine's own work around a "
                     f"step: {1e3 * overlap.engine_s:.3f} ms + "
                     f"{1e9 * overlap.engine_token_s:.1f} ns a prompt token")
    steps = overlap.source_steps
    lines.append(f"  interval = device + host + offset for a sequential step "
                 f"({steps.get('sequential', 0)} in the source), max(device, host) + offset "
                 f"for an overlapped one ({steps.get('overlapped', 0)}); offsets:")
    for name in STEP_CLASSES:
        if name not in overlap.host:
            continue
        modes = MODES if name.startswith("decode") else MODES[:1]  # only decodes overlap
        parts = [f"{mode} {1e3 * overlap.offset(mode, name):+.3f} ms "
                 f"({overlap.offset_source.get(mode, {}).get(name, '')})" for mode in modes]
        lines.append(f"    {name:<{NAME_WIDTH}} " + ", ".join(parts))
    interval = overlap.heldout.get("interval", {})
    if interval.get("all"):
        parts = [f"{mode} MAPE {interval[mode]['mape_pct']:.1f}% on {interval[mode]['n']}"
                 for mode in MODES if interval.get(mode)]
        lines.append(
            f"  interval held-out: MAPE {interval['all']['mape_pct']:.1f}%, summed time "
            f"{interval['all']['sum_error_pct']:+.2f}% ({'; '.join(parts)})")
    for name, seconds in overlap.host_warmup_s.items():
        lines.append(f"  host warm-up: the first {name} step's host work took "
                     f"{seconds:+.3f} s beyond the model (charged once per run)")
    return lines


def describe(model: Any, target: Any = None) -> str:
    """A few lines on a ``CostModel``: what was fitted on what, the held-out error, what the
    source cannot identify and (given a ``target`` event stream) where the target lies
    outside it."""
    mode = (
        "interval mode: fitted on each step's wall interval; the trace records no host time"
        if model.overlap is None else
        "overlap mode: device time per class below, then host time and the overlap rule"
    )
    lines = [f"step-time model from {model.source or 'a trace'} ({mode}):"]
    for name in (*STEP_CLASSES, POOLED):
        fit = model.fits.get(name)
        if fit is None:
            continue
        held = ("fallback for a class without its own fit" if name == POOLED
                else _heldout_words(model.heldout.get(name)) or "no held-out steps")
        feats = ", ".join(fit.features) or "intercept only"
        if fit.floor > 0:
            feats = f"max({1e3 * fit.floor:.2f} ms floor, {feats})"
        chosen = model.selection.get(name, {}).get("holdout")
        how = f" (chosen by {chosen} held-out error)" if chosen else ""
        lines.append(f"  {name:<{NAME_WIDTH}} {fit.samples:>6} steps  [{feats}]{how}  {held}")
    total = model.heldout.get("all")
    if total:
        what = " (device time)" if model.overlap is not None else ""
        lines.append(f"  all held-out steps{what}: MAPE {total['mape_pct']:.1f}%, "
                     f"summed time {total['sum_error_pct']:+.2f}%")
    if model.prefill_graph_sizes:
        sizes = model.prefill_graph_sizes
        lines.append(f"  prefill CUDA graphs: {len(sizes)} token counts, {sizes[0]:,} to "
                     f"{sizes[-1]:,}, up to {model.prefill_graph_max_seqs} sequences each "
                     "(a prefill within them is padded to the next and runs as prefill_graph)")
    if model.shared_kv:
        fractions = {model.shared_read_fraction}
        if model.prior is not None:
            fractions.add(model.prior.shared_read_fraction)
        lines.append("  decode re-reads of a block other rows of the step read too: "
                     + " / ".join(f"{f:.2f}" for f in sorted(fractions))
                     + " of a read from memory (the simulator counts each step's distinct blocks)")
    add = model.add
    if add.samples:
        lines.append(f"  adding a request (the live loop's intake, from {add.samples} gaps between "
                     f"the source's add stamps): {1e6 * add.per_request_s:.1f} us + "
                     f"{1e9 * add.per_token_s:.1f} ns a prompt token, charged as each is fed "
                     "(as the source's driver added its requests)")
    else:
        lines.append("  adding a request: not measured (no add stamps of the engine's own in the "
                     "source): adds are free")
    if model.overlap is not None:
        lines += overlap_lines(model.overlap)
    for name, seconds in model.warmup_s.items():
        lines.append(f"  warm-up: the first {name} step took {seconds:+.3f} s beyond the model "
                     "(charged once per run)")
    if model.window_steps:
        lines.append(f"  warm-up window: the run's first {model.window_steps} steps (left out "
                     "where later steps cover their range)")
    lines += [f"  warning: {line}" for line in model.caveats()]
    if target is not None:
        lines += [f"  warning: {line}" for line in model.coverage_warnings(target)]
    return "\n".join(lines)
