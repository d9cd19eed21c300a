"""What the step-time model is fitted on: each step's features, class and measured times.

Every feature but ``padded_tokens`` is a ``model_step`` column (and a calibration row key).
``padded_tokens`` is the tokens the forward computed: the column of that name where a CUDA-graph
prefill padded its tokens (nonzero), else the step's own tokens, prefill tokens plus decode rows.
A trace recorded before the column existed reads 0 there (``tracing.schema``), a calibration row
before the key existed lacks it: both computed their own tokens.

``steps_of`` reads a trace into ``Steps``: its own steps, then the header's start-up calibration
steps (engine/calibration.py), which show costs the run never did (a small prefill's launch floor).

CUDA graphs (the rule: ``engine.graph_sizes``): a simulation pads its steps as the source's engine
did. ``observed_graph_sizes`` reads the decode batch sizes off the source's steps;
``source_prefill_graphs`` the prefill token counts from its header (``executor``), else from the
padded counts of its graph prefills.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np

from engine import graph_sizes
from replay.recorded import RecordedEvents
from tracing.schema import NOT_PADDED


class StepFeatures(NamedTuple):
    """One step's batch features, in the order of every coefficient vector (``FEATURES``)."""

    num_seqs: float
    prefill_tokens: float
    prefill_attn_work: float
    decode_seqs: float
    decode_context_tokens: float
    padded_batch_size: float
    # Derived (``computed_tokens``); last, so that the other features keep their positions.
    padded_tokens: float


FEATURES: tuple[str, ...] = StepFeatures._fields
PADDED_TOKENS = "padded_tokens"
RECORDED_FEATURES = FEATURES[:-1]


@dataclass(frozen=True)
class ClassSpec:
    """A step class: how it is fitted, and what prices it where the source ran none of it."""

    name: str
    # Runs without a CUDA graph: an eager forward has a launch-bound floor, and its kernels run on
    # the device while the host still launches later ones (the overlap rule's max).
    eager: bool
    # The size it is extrapolated along (its knee separates floor and compute regimes).
    size_feature: str
    feature_sets: tuple[tuple[str, ...], ...]  # candidate linear feature sets, simplest first
    fallbacks: tuple[str, ...] = ()  # device fit without its own: the first of these fitted
    host_fallbacks: tuple[str, ...] = ()  # host fit without its own: likewise


# The fit over every step, whatever its class: a class without a related fit's last resort.
POOLED = "pooled"
# What a class without a fit of its own may be priced by instead (``model.resolve``).
COMPOSITE = "composite"  # a mixed step: the prefill fit plus the decode slopes
GRAPH_FROM_EAGER = "graph_from_eager"  # a graph prefill: the eager prefill fit's compute part
MODES = ("sequential", "overlapped")  # how a step was launched (``model_step.overlapped``)
_MIXED_SETS = (("prefill_tokens", "decode_context_tokens"),
               ("prefill_tokens", "prefill_attn_work", "decode_seqs", "decode_context_tokens"))
CLASSES: dict[str, ClassSpec] = {spec.name: spec for spec in (
    # An eager prefill. A graph prefill's fit has no launch floor (may be low): its last resort.
    # Host work: an eager step's is its kernel launches, a mixed step's like a prefill's.
    ClassSpec("prefill", True, "prefill_tokens",
              (("prefill_tokens",), ("prefill_tokens", "prefill_attn_work"),
               ("prefill_tokens", "prefill_attn_work", "num_seqs")),
              ("mixed", "prefill_graph", POOLED), ("mixed",)),
    # Replayed from a graph captured per padded token count (engine/runner/prefill_graphs.py):
    # its GEMMs compute every padded row. An eager prefill fit without a compute slope (a floor
    # only) is an upper bound. Host work: staging, one graph launch and sampling, as a decode's.
    ClassSpec("prefill_graph", False, PADDED_TOKENS,
              ((PADDED_TOKENS,), (PADDED_TOKENS, "prefill_attn_work"), (PADDED_TOKENS, "num_seqs"),
               (PADDED_TOKENS, "prefill_attn_work", "num_seqs")),
              ("prefill", "mixed", POOLED), ("decode_graph",)),
    ClassSpec("decode_graph", False, "num_seqs",
              (("decode_context_tokens",), ("padded_batch_size", "decode_context_tokens"),
               ("decode_seqs", "decode_context_tokens"),
               ("padded_batch_size", "decode_seqs", "decode_context_tokens")),
              ("decode_eager", POOLED), ("prefill_graph", "decode_eager")),
    ClassSpec("decode_eager", True, "num_seqs",
              (("decode_context_tokens",), ("decode_seqs", "decode_context_tokens")),
              ("decode_graph", POOLED), ("decode_graph",)),
    ClassSpec("mixed", True, "prefill_tokens", _MIXED_SETS, (POOLED,), ("prefill",)),
    ClassSpec(POOLED, False, "num_seqs", ((), *_MIXED_SETS)),
)}
STEP_CLASSES = tuple(name for name in CLASSES if name != POOLED)
EAGER_CLASSES = frozenset(name for name, spec in CLASSES.items() if spec.eager)
NAME_WIDTH = max(len(name) for name in CLASSES)  # reports align a column of class names


def step_class(kind: Any, graph_used: Any) -> Any:
    """The cost class of a step: its batch kind, split by whether a CUDA graph ran it. Given
    arrays (a step each), an array of classes."""
    if not isinstance(kind, str):
        return np.array([step_class(str(k), bool(g)) for k, g in zip(kind, graph_used)],
                        dtype=str)
    if kind == "decode":
        return "decode_graph" if graph_used else "decode_eager"
    if kind == "prefill" and graph_used:
        return "prefill_graph"
    return kind


def computed_tokens(padded: float, prefill_tokens: float, decode_seqs: float) -> float:
    """The ``padded_tokens`` feature: the recorded padded count where there is one, else the
    step's own tokens."""
    return padded if padded != NOT_PADDED else prefill_tokens + decode_seqs


def first_of_class(classes: np.ndarray) -> np.ndarray:
    """A mask of each class's first step."""
    mask = np.zeros(len(classes), dtype=bool)
    for name in np.unique(classes):
        mask[np.flatnonzero(classes == name)[0]] = True
    return mask


@dataclass
class Steps:
    """Steps to fit, one row each: a trace's own steps, then its calibration steps."""

    x: np.ndarray  # (steps x len(FEATURES)) features
    classes: np.ndarray
    # What the class fits are of: the device time where the trace measured host time (overlap
    # mode), else the interval (for a calibration step, its executor call plus the run's
    # typical engine overhead around a step).
    time: np.ndarray
    host: np.ndarray  # the engine's own CPU work (NaN: not measured)
    interval: np.ndarray  # wall seconds it added to the run (a calibration step: its call's)
    overlapped: np.ndarray  # launched while the previous step ran
    is_calibration: np.ndarray
    window: np.ndarray  # in the run's warm-up window (``fit.warmup_window``)

    def __len__(self) -> int:
        return len(self.time)

    def rows(self, mask: np.ndarray) -> Steps:
        return Steps(*(getattr(self, f.name)[mask] for f in fields(self)))

    def concat(self, other: Steps) -> Steps:
        return Steps(*(np.concatenate([getattr(self, f.name), getattr(other, f.name)])
                       for f in fields(self)))


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
    columns[PADDED_TOKENS] = np.array(
        [computed_tokens(*row) for row in zip(padded.tolist(), columns["prefill_tokens"].tolist(),
                                               columns["decode_seqs"].tolist())], dtype=float)
    x = np.column_stack([columns[name] for name in FEATURES])
    classes = step_class(kinds, np.asarray(ms["graph_used"], dtype=bool))
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


# A trace whose typical step has less host time than this did not measure it (zeros, rounding).
HOST_MEASURED_S = 1e-6


def has_host_times(events: RecordedEvents) -> bool:
    """Whether the trace measured each step's host work (schema 2 and a real measurement: a
    version-1 trace reads NaN; a recorder that measured nothing wrote zeros, or rounding noise:
    a real step's host work takes microseconds at least)."""
    ms = events.tables["model_step"]
    if "host_s" not in ms:
        return False
    host = np.asarray(ms["host_s"], dtype=float)
    return (len(host) > 0 and bool(np.isfinite(host).all())
            and float(np.median(host)) > HOST_MEASURED_S)


def steps_of(events: RecordedEvents) -> Steps:
    """The trace's steps and its header's calibration steps (``Steps``).

    A calibration row's ``interval_s`` times the executor call alone, its ``wait_s`` (where
    recorded) the part spent waiting for the device, so ``interval_s - wait_s`` is its host
    work. Fitted on intervals (no host time measured), a row is charged the median over the
    run's steps of the engine's own work around a step (scheduling, post-processing,
    recording), which a real step pays too."""
    ms = events.tables["model_step"]
    x, classes = feature_matrix(events)
    n = len(classes)
    duration = np.asarray(ms["duration_s"], dtype=float)
    interval = step_intervals(events)
    measured_host = has_host_times(events)
    host = np.asarray(ms["host_s"], dtype=float) if measured_host else np.full(n, np.nan)
    overlapped = (np.asarray(ms["overlapped"], dtype=bool) if "overlapped" in ms
                  else np.zeros(n, dtype=bool))
    own = Steps(x, classes, duration if measured_host else interval, host, interval, overlapped,
                np.zeros(n, dtype=bool), np.zeros(n, dtype=bool))
    rows = events.header.get("calibration") or []
    if not rows:
        return own
    called = np.array([float(row["interval_s"]) for row in rows])
    if measured_host:
        time = np.array([float(row.get("duration_s", row["interval_s"])) for row in rows])
    else:
        overhead = interval - duration
        extra = float(np.median(np.clip(overhead, 0.0, None))) if len(overhead) else 0.0
        time = np.array([float(row["interval_s"]) + extra for row in rows])
    waited = [row.get("wait_s") for row in rows]
    cal_host = np.array([np.nan if wait is None else float(row["interval_s"]) - float(wait)
                         for row, wait in zip(rows, waited)])
    k = len(rows)
    return own.concat(Steps(
        calibration_features(rows),
        np.array([step_class(row["kind"], bool(row["graph_used"])) for row in rows]),
        time, cal_host, called, np.zeros(k, dtype=bool), np.ones(k, dtype=bool),
        np.zeros(k, dtype=bool)))


# --- CUDA graphs of the source ------------------------------------------------------------------
# Header keys of the executor's description when it captured prefill graphs.
HEADER_SIZES = "prefill_graph_tokens"
HEADER_MAX_SEQS = "prefill_graph_max_seqs"


def observed_graph_sizes(events: RecordedEvents) -> list[int]:
    """The graph batch sizes the source run padded decodes to: the engine's if they agree with
    every observed (batch, padded) pair, else the sizes seen (a batch above them runs eager)."""
    ms = events.tables["model_step"]
    # Only decodes: a graph prefill's padded_batch_size is its own batch (it pads tokens).
    graph = np.asarray(ms["graph_used"], dtype=bool) & (np.asarray(ms["kind"]).astype(str)
                                                        == "decode")
    if not graph.any():
        return []
    seqs = np.asarray(ms["num_seqs"], dtype=np.int64)[graph]
    padded = np.asarray(ms["padded_batch_size"], dtype=np.int64)[graph]
    engine = graph_sizes.decode_graph_sizes()
    if all(graph_sizes.padded_decode_size(engine, int(s)) == p for s, p in zip(seqs, padded)):
        return engine
    return sorted(set(padded.tolist()))


def _graph_prefills(events: RecordedEvents) -> list[tuple[int, int, int]]:
    """(prompt tokens, sequences, padded tokens) of every graph prefill the source ran: its
    steps and its header's calibration steps."""
    ms = events.tables["model_step"]
    kinds = np.asarray(ms["kind"]).astype(str)
    padded = ms.get(PADDED_TOKENS)
    padded = np.zeros(len(kinds), dtype=np.int64) if padded is None else np.asarray(
        padded, dtype=np.int64)
    rows = np.flatnonzero((kinds == "prefill") & np.asarray(ms["graph_used"], dtype=bool)
                          & (padded > 0))
    tokens = np.asarray(ms["prefill_tokens"], dtype=np.int64)
    seqs = np.asarray(ms["num_seqs"], dtype=np.int64)
    out = [(int(tokens[i]), int(seqs[i]), int(padded[i])) for i in rows]
    calibration: list[Mapping[str, Any]] = events.header.get("calibration") or []
    out += [(int(row["prefill_tokens"]), int(row["num_seqs"]), int(row[PADDED_TOKENS]))
            for row in calibration
            if row.get("kind") == "prefill" and row.get("graph_used")
            and int(row.get(PADDED_TOKENS, 0)) > 0]
    return out


def source_prefill_graphs(events: RecordedEvents) -> tuple[list[int], int]:
    """The token counts the source captured prefill graphs for (ascending) and the most
    sequences one takes; ([], 0): it captured none (or recorded none: an older trace).

    From the header where the executor described them. Else from the graph prefills it ran: the
    engine's sizes for the source's config where every one was padded as those say, else only
    the counts seen (a prefill above them is taken to run eager)."""
    executor = events.header.get("executor") or {}
    if executor.get(HEADER_SIZES):
        sizes = sorted(int(s) for s in executor[HEADER_SIZES])
        max_seqs = executor.get(HEADER_MAX_SEQS)
        if max_seqs is None:
            max_seqs = graph_sizes.MAX_GRAPH_PREFILL_SEQS
        return sizes, int(max_seqs)
    seen = _graph_prefills(events)
    if not seen:
        return [], 0
    config = events.header.get("config") or {}
    limit = min(int(config.get("prefill_graph_tokens", 0)),
                int(config.get("max_num_batched_tokens", 0)))
    engine_sizes = graph_sizes.prefill_graph_sizes(limit)
    max_seqs = graph_sizes.MAX_GRAPH_PREFILL_SEQS
    if all(graph_sizes.padded_prefill_tokens(engine_sizes, tokens, seqs, max_seqs) == padded
           for tokens, seqs, padded in seen):
        return engine_sizes, max_seqs
    return sorted({padded for _, _, padded in seen}), max_seqs


def captured_within(sizes: Sequence[int], limit: int) -> list[int]:
    """The source's captured prefill token counts a config whose ``prefill_graph_limit`` is
    ``limit`` captures too (the engine captures none above it)."""
    return [size for size in sizes if size <= limit]
