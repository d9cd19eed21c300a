"""The steps a step-time model is fitted on: their features, classes and measured times.

``feature_matrix`` gives each recorded step's batch features and class; ``step_intervals`` the
wall time it added to the run; ``with_calibration`` appends the header's start-up calibration
steps (engine/calibration.py) to the fitted ones.
"""

from __future__ import annotations

import numpy as np

from replay.cost_fit import FEATURES
from replay.recorded import RecordedEvents


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


def with_calibration(
    events: RecordedEvents, x: np.ndarray, y: np.ndarray, classes: np.ndarray, window: np.ndarray,
    device: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Add the header's start-up calibration steps (engine/calibration.py) to the fitted steps.

    ``device``: the fit is of device time, and each row gives its ``duration_s``. Else (a fit of
    intervals) a row's ``interval_s`` times the executor call alone, while a real step also pays
    the engine's own work around it (scheduling, post-processing, recording), so each row is
    charged the median of that overhead over the run's steps.
    """
    rows = events.header.get("calibration") or []
    if not rows:
        return x, y, classes, window
    cal_x = np.array([[float(row[name]) for name in FEATURES] for row in rows])
    if device:
        cal_y = np.array([float(row.get("duration_s", row["interval_s"])) for row in rows])
    else:
        ms = events.tables["model_step"]
        overhead = step_intervals(events) - np.asarray(ms["duration_s"], dtype=float)
        extra = float(np.median(np.clip(overhead, 0.0, None))) if len(overhead) else 0.0
        cal_y = np.array([float(row["interval_s"]) + extra for row in rows])
    cal_classes = np.array([step_class(row["kind"], bool(row["graph_used"])) for row in rows])
    return (
        np.vstack([x, cal_x]),
        np.concatenate([y, cal_y]),
        np.concatenate([classes, cal_classes]),
        np.concatenate([window, np.zeros(len(rows), dtype=bool)]),
    )
