"""Studies of the validation matrix: where the step-time model's time goes wrong per step class
(``step_errors``), how the host's speed moves during a run and the eager steps' device time with
it (``host_drift``), where a target's TTFT goes (``request_waits``, with ``queued_steps``),
and how the matrix changes with each mechanism of the model switched off (``ablation``).

``step_errors`` prices each *recorded* step of a target by the model (its recorded features,
class and launch mode), so its errors are the model's alone, free of any decision that a
simulation takes differently; it also counts the stalls (a step far slower than its class's
median: a JIT compilation in the recorded process) and the idle time between steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from replay.whatif.cost import features
from replay.whatif.cost.model import CostModel
from replay.whatif.cost.options import CostOptions

# A step longer than this many times its class's median, and by this many seconds, is a stall.
STALL_FACTOR = 10.0
STALL_MIN_S = 0.1
DRIFT_WINDOWS = 12  # ``host_drift``: spans of wall time a run is cut into
IDLE_GAP_S = 0.05  # ``step_errors``: uncovered wall time before a step that makes it "after idle"
# The switches an ablation turns off one at a time (``CostOptions``), and the profile settings.
SWITCHES = ("warmup_steps", "warmup_window", "calibration", "overlap", "class_offsets",
            "engine_host", "profile_scale", "run_weight", "longest_program", "request_add",
            "prefill_roofline", "shared_reads", "causal_work", "relative_roofline")
# Mechanisms off by default that an ablation turns on (``CostOptions``).
OPT_IN = ("shared_kv", "host_stalls", "host_spread")


def step_errors(model: CostModel, events: Any) -> dict[str, Any]:
    """Per step class and launch mode of ``events``' own steps: how many, and the recorded and
    predicted sums of device time, host time and interval (seconds); the stalls among them;
    and the run's idle time (wall time between steps that no step's interval covers). Where
    some of a class's steps came after the engine idled (more than ``IDLE_GAP_S`` of wall time
    no interval covers), they are also shown alone (``"<class> <mode>, after idle"``, a subset
    of the row before it): a host slower after a wait shows there."""
    # As the simulator counts: shared blocks, and the adds it charges as it feeds them.
    steps = features.steps_of(events, shared_blocks=model.shared_kv, add=model.add,
                              causal=model.causal_work)
    own = steps.rows(~steps.is_calibration)
    predicted = [model.predict(row, str(cls), bool(over)) for row, cls, over in
                 zip(own.x.tolist(), own.classes.tolist(), own.overlapped.tolist())]
    device = np.array([p.device_s for p in predicted])
    host = np.array([p.host_s for p in predicted])
    interval = np.array([p.interval_s for p in predicted])
    wall = np.asarray(events.tables["model_step"]["wall_time_s"], dtype=float)
    after_idle = np.zeros(len(own.time), dtype=bool)
    if len(wall) == len(own.time) > 1:  # the wall time before a step that no interval covers
        after_idle[1:] = np.diff(wall) - np.nan_to_num(own.interval[1:]) > IDLE_GAP_S
    classes: dict[str, Any] = {}
    for name in np.unique(own.classes).astype(str).tolist():
        of_class = own.classes == name
        median = float(np.median(own.time[of_class]))
        stalls = of_class & (own.time > max(STALL_FACTOR * median, median + STALL_MIN_S))
        for mode, flag in zip(features.MODES, (False, True)):
            rows = of_class & (own.overlapped == flag)
            for key, subset in ((f"{name} {mode}", rows),
                                (f"{name} {mode}, after idle", rows & after_idle)):
                if not subset.any():
                    continue
                classes[key] = {
                    "steps": int(subset.sum()), "stalls": int((subset & stalls).sum()),
                    "stall_s": float(own.time[subset & stalls].sum()),
                    "device_s": [float(own.time[subset].sum()), float(device[subset].sum())],
                    "host_s": [float(np.nansum(own.host[subset])), float(host[subset].sum())],
                    "interval_s": [float(own.interval[subset].sum()),
                                   float(interval[subset].sum())],
                }
    span = float(wall[-1] - wall[0]) if len(wall) else 0.0
    return {"classes": classes, "wall_s": span,
            "idle_s": max(span - float(own.interval[1:].sum()), 0.0)}


def step_errors_markdown(cells: dict[str, dict[str, Any]]) -> str:
    """``step_errors`` of each cell as one Markdown table (recorded -> predicted, error %)."""
    def pair(values: list[float]) -> str:
        recorded, predicted = values
        error = 100 * (predicted - recorded) / recorded if recorded > 0 else 0.0
        return f"{recorded:.3f} → {predicted:.3f} ({error:+.0f}%)"

    lines = ["| cell | class, launch | steps | stalls (s) | device s | host s | interval s |",
             "|---|---|---|---|---|---|---|"]
    for cell, report in cells.items():
        for key, row in report["classes"].items():
            stalls = f"{row['stalls']} ({row['stall_s']:.2f})" if row["stalls"] else "0"
            lines.append(f"| {cell} | {key} | {row['steps']} | {stalls} | "
                         f"{pair(row['device_s'])} | {pair(row['host_s'])} | "
                         f"{pair(row['interval_s'])} |")
        lines.append(f"| {cell} | idle between steps | | | | | {report['idle_s']:.3f} "
                     f"of {report['wall_s']:.3f} wall |")
    return "\n".join(lines)


def host_drift(model: CostModel, events: Any, windows: int = DRIFT_WINDOWS) -> list[dict[str, Any]]:
    """The run cut into ``windows`` equal spans of wall time: per span with steps, how many
    CUDA-graph decode and eager steps ended in it, the median host time of each (seconds), and
    the eager steps' recorded and predicted device time (sums; ``model.predict`` of their
    recorded features). An eager step's device time holds host work (its inputs are built and
    its kernels launched after its timer starts), so where the host slows down mid-run, both
    host medians rise and the eager device time with them, which a model priced at one host
    speed cannot follow."""
    steps = features.steps_of(events, causal=model.causal_work)
    own = steps.rows(~steps.is_calibration)
    wall = np.asarray(events.tables["model_step"]["wall_time_s"], dtype=float)
    if not len(wall):
        return []
    eager = np.isin(own.classes, list(features.EAGER_CLASSES))
    decode = own.classes == "decode_graph"
    predicted = np.array([model.predict(row, str(cls), bool(over)).device_s if is_eager else 0.0
                          for row, cls, over, is_eager in zip(own.x.tolist(), own.classes.tolist(),
                                                              own.overlapped.tolist(),
                                                              eager.tolist())])
    edges = np.linspace(wall.min(), wall.max(), windows + 1)
    span = np.clip(np.searchsorted(edges, wall, side="right") - 1, 0, windows - 1)
    rows = []
    for index in range(windows):
        inside = span == index
        if not inside.any():
            continue
        dec, eag = inside & decode, inside & eager
        rows.append({
            "start_s": float(edges[index] - edges[0]), "decode_steps": int(dec.sum()),
            "decode_host_s": float(np.median(own.host[dec])) if dec.any() else None,
            "eager_steps": int(eag.sum()),
            "eager_host_s": float(np.median(own.host[eag])) if eag.any() else None,
            "eager_device_s": [float(own.time[eag].sum()), float(predicted[eag].sum())],
        })
    return rows


def host_drift_markdown(cells: dict[str, list[dict[str, Any]]]) -> str:
    """``host_drift`` of each cell as one Markdown table (medians in ms; recorded -> predicted
    device time of the eager steps, and their ratio)."""
    def ms(value: float | None) -> str:
        return "–" if value is None else f"{1e3 * value:.2f}"

    lines = ["| cell | from (s) | decode steps | decode host (ms) | eager steps | "
             "eager host (ms) | eager device s, recorded → predicted |",
             "|---|---|---|---|---|---|---|"]
    for cell, rows in cells.items():
        for row in rows:
            recorded, predicted = row["eager_device_s"]
            device = (f"{recorded:.3f} → {predicted:.3f} (x{recorded / predicted:.2f})"
                      if row["eager_steps"] and predicted > 0 else "–")
            lines.append(f"| {cell} | {row['start_s']:.1f} | {row['decode_steps']} | "
                         f"{ms(row['decode_host_s'])} | {row['eager_steps']} | "
                         f"{ms(row['eager_host_s'])} | {device} |")
    return "\n".join(lines)


def ablation_variants(base: CostOptions, with_profile: bool) -> dict[str, CostOptions | None]:
    """The model as configured (``base``), then each switch off in turn (each opt-in one on);
    with a profile also the other profile modes; ``None``: no profile at all."""
    out: dict[str, CostOptions | None] = {"all mechanisms": base}
    for name in SWITCHES:
        if getattr(base, name):
            out[f"{name}=off"] = replace(base, **{name: False})
    for name in OPT_IN:
        if not getattr(base, name):
            out[f"{name}=on"] = replace(base, **{name: True})
    if with_profile:
        for mode in ("blend", "pooled", "profile"):
            if mode != base.profile_mode:
                out[f"profile_mode={mode}"] = replace(base, profile_mode=mode)
        out["no profile"] = None
    return out


def ablation_summary(rows: list[dict[str, Any]], targets: dict[str, float]) -> dict[str, Any]:
    """Per metric the mean absolute error over the predicted cells, and how many cells x metrics
    miss their target."""
    cells = [r for r in rows if r.get("kind") == "prediction" and r.get("status") == "ok"]
    out: dict[str, Any] = {"cells": len(cells), "misses": 0}
    for metric, target in targets.items():
        values = [abs(r[metric]) for r in cells if r.get(metric) is not None]
        out[metric] = float(np.mean(values)) if values else None
        out["misses"] += sum(v > target for v in values)
    return out


def ablation_markdown(results: dict[str, dict[str, Any]], targets: dict[str, float]) -> str:
    """One row per variant: mean absolute error of each metric (%) and the misses."""
    head = ["variant", *targets, "cells x metrics missed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, summary in results.items():
        cells = [("–" if summary[m] is None else f"{100 * summary[m]:.1f}%") for m in targets]
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {summary['misses']} of {summary['cells'] * len(targets)} |")
    return "\n".join(lines)


def request_waits(model: CostModel, events: Any) -> dict[str, list[float]]:
    """Where a target's TTFT goes, recorded against predicted (the target's workload simulated
    under its own Config by ``model``): per metric, [recorded, predicted] of the median and mean
    over requests of ``queue_s`` (arrival to first scheduled) and the rest of the TTFT (the
    first step and any steps before the first token), so a TTFT error is placed in the wait for
    a step or in the steps; and ``queued_steps``'s "queued steps", the part of the queue's
    error that the step prices make."""
    from replay.metrics import compute
    from replay.whatif.simulate import cold_start_of, load_source, run_variant

    recorded = compute(events).requests
    predicted = run_variant(load_source(events), {}, model, "waits",
                            cold_start=cold_start_of(events.header))
    if not predicted.ok or predicted.requests is None:
        return {}
    out: dict[str, list[float]] = queued_steps(model, events)
    for table in (recorded, predicted.requests):
        ttft = np.asarray(table["ttft_s"], dtype=float)
        queue = np.asarray(table["queue_s"], dtype=float)
        for name, values in (("ttft", ttft), ("queue", queue), ("after queue", ttft - queue)):
            out.setdefault(f"{name} p50", []).append(float(np.nanmedian(values)))
            out.setdefault(f"{name} mean", []).append(float(np.nanmean(values)))
    return out


def queued_steps(model: CostModel, events: Any) -> dict[str, list[float]]:
    """The recorded steps as requests waiting through them see them: ``"queued steps"``,
    [recorded, predicted] seconds summed over steps, each weighted by the requests still
    waiting once it was scheduled (``batch_scheduled.num_waiting``); predicted by
    ``model.predict`` of the step's recorded features, as ``step_errors``. This is the part of
    the queue's error the step prices make with the recorded decisions held: where the queue's
    own error is many times it, the simulated queue drained at another step and its later
    arrivals met another queue (a run near saturation amplifies a step error so)."""
    steps = features.steps_of(events, shared_blocks=model.shared_kv, add=model.add,
                              causal=model.causal_work)
    own = steps.rows(~steps.is_calibration)
    waiting = dict(zip(events.tables["batch_scheduled"]["step"],
                       events.tables["batch_scheduled"]["num_waiting"]))
    step_ids = events.tables["model_step"]["step"]
    if len(step_ids) != len(own.interval):
        return {}
    weights = np.array([waiting.get(step, 0) for step in step_ids], dtype=float)
    rows = np.flatnonzero(weights > 0)
    recorded = float(np.dot(weights[rows], np.nan_to_num(own.interval[rows])))
    predicted = sum(weight * model.predict(own.x[row], str(own.classes[row]),
                                           bool(own.overlapped[row])).interval_s
                    for row, weight in zip(rows.tolist(), weights[rows].tolist()))
    return {"queued steps": [recorded, float(predicted)]}


def request_waits_markdown(cells: dict[str, dict[str, list[float]]]) -> str:
    """``request_waits`` of each cell as one Markdown table (ms, recorded -> predicted)."""
    names = ["ttft p50", "queue p50", "after queue p50", "ttft mean", "queue mean",
             "after queue mean"]
    lines = ["| cell | " + " | ".join(f"{n} ms" for n in names) + " | queued steps s |",
             "|---" * (len(names) + 2) + "|"]
    for cell, waits in cells.items():
        if not waits:
            lines.append(f"| {cell} | " + " | ".join("cannot run" for _ in names) + " | - |")
            continue
        parts = []
        for name in names:
            recorded, predicted = waits[name]
            error = 100 * (predicted - recorded) / recorded if recorded > 0 else 0.0
            parts.append(f"{1e3 * recorded:.1f} → {1e3 * predicted:.1f} ({error:+.0f}%)")
        queued = waits.get("queued steps")
        parts.append("none" if not queued or queued[0] <= 0 else
                     f"{queued[0]:.2f} → {queued[1]:.2f} "
                     f"({100 * (queued[1] - queued[0]) / queued[0]:+.1f}%)")
        lines.append(f"| {cell} | " + " | ".join(parts) + " |")
    return "\n".join(lines)
