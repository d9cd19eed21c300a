"""The steps a step-time model is fitted on: their features, classes and measured times.

``feature_matrix`` gives each recorded step's batch features and class; ``step_intervals`` the
wall time it added to the run; ``with_calibration`` appends the header's start-up calibration
steps (engine/calibration.py) to the fitted ones (``calibration_features``: their features).

Every feature but ``padded_tokens`` is a ``model_step`` column (and a calibration row key).
``padded_tokens`` is the tokens the forward computed: the column of that name where a CUDA-graph
prefill padded its tokens (nonzero), else the step's own tokens, prefill tokens plus decode rows.
A trace recorded before the column existed reads 0 there (``tracing.events``), a calibration row
before the key existed lacks it: both computed their own tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from replay.recorded import RecordedEvents
from replay.whatif.cost.fit import FEATURES
from tracing.schema import NOT_PADDED

PADDED_TOKENS = "padded_tokens"
# The recorded features; PADDED_TOKENS is derived from them and its own column.
RECORDED_FEATURES = tuple(name for name in FEATURES if name != PADDED_TOKENS)


def step_class(kind: str, graph_used: bool) -> str:
    """The cost class of a step: its batch kind, split by whether a CUDA graph ran it."""
    if kind == "decode":
        return "decode_graph" if graph_used else "decode_eager"
    if kind == "prefill" and graph_used:
        return "prefill_graph"
    return kind


def computed_tokens(padded: Any, prefill_tokens: Any, decode_seqs: Any) -> Any:
    """The ``padded_tokens`` feature: the recorded padded count where nonzero, else the step's
    own tokens (element-wise on arrays)."""
    return np.where(np.asarray(padded) != NOT_PADDED, padded,
                    np.asarray(prefill_tokens) + np.asarray(decode_seqs))


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
    kinds = np.asarray(ms["kind"]).astype(str)
    columns = {name: np.asarray(ms[name], dtype=float) for name in RECORDED_FEATURES}
    padded = ms.get(PADDED_TOKENS)
    padded = np.full(len(kinds), float(NOT_PADDED)) if padded is None else np.asarray(
        padded, dtype=float)
    columns[PADDED_TOKENS] = computed_tokens(padded, columns["prefill_tokens"],
                                             columns["decode_seqs"])
    x = np.column_stack([columns[name] for name in FEATURES])
    graph = np.asarray(ms["graph_used"], dtype=bool)
    classes = np.where(kinds == "decode", np.where(graph, "decode_graph", "decode_eager"),
                       np.where((kinds == "prefill") & graph, "prefill_graph", kinds))
    return x.reshape(len(kinds), len(FEATURES)), classes


def calibration_features(rows: list[Mapping[str, Any]]) -> np.ndarray:
    """(rows x len(FEATURES)) features of header calibration rows (a row without the
    ``padded_tokens`` key computed its own tokens)."""
    out = np.zeros((len(rows), len(FEATURES)))
    for i, row in enumerate(rows):
        values = {name: float(row[name]) for name in RECORDED_FEATURES}
        values[PADDED_TOKENS] = float(computed_tokens(
            row.get(PADDED_TOKENS, NOT_PADDED), values["prefill_tokens"], values["decode_seqs"]))
        out[i] = [values[name] for name in FEATURES]
    return out


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
    cal_x = calibration_features(rows)
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
