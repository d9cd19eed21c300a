"""What the step-time model prices: each step's features and class (the features themselves and
a class's linear form of time: ``linear``).

``CLASSES`` says how each step class is fitted and, where the source ran none of it, which fits
price it (``class_fit``). ``steps_of`` reads a trace into ``Steps``: its own steps, then its
header's start-up calibration steps (engine/calibration.py), which show costs the run never did (a
small prefill's launch floor). A simulation pads its steps for CUDA graphs as the source's engine
did (the rule: ``engine.graph_sizes``; the sizes: ``observed_graph_sizes``,
``source_prefill_graphs``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from engine.attention_splits import choose_num_splits
from replay.recorded import RecordedEvents
from replay.whatif.cost.arrivals import AddCost, adds_within
from replay.whatif.cost.decode_attention import (
    DEFAULT_KV_HEADS,
    kv_heads_of,
    longest_contexts,
    prompt_squares,
    recorded_rereads,
)
from replay.whatif.cost.linear import (  # noqa: F401 (re-exported: the model's vocabulary)
    FEATURES,
    MIN_STEP_S,
    PADDED_TOKENS,
    PREFILL_LONGEST,
    RECORDED_FEATURES,
    LinearFit,
    StepFeatures,
    causal_work,
)
from tracing.schema import NOT_PADDED


@dataclass(frozen=True)
class ClassSpec:
    """A step class. ``eager``: no CUDA graph runs it, so it has a launch-bound floor, and its
    kernels run while the host still launches later ones. ``size_feature``: what it is
    extrapolated along (a knee on it separates floor and compute). ``feature_sets``: candidate
    linear feature sets, simplest first. ``fallbacks``, ``host_fallbacks``: whose device and host
    fits price it where the source ran none of it, the first fitted."""

    name: str
    eager: bool
    size_feature: str
    feature_sets: tuple[tuple[str, ...], ...]
    fallbacks: tuple[str, ...] = ()
    host_fallbacks: tuple[str, ...] = ()


POOLED = "pooled"  # the fit over every step: a class without a related fit's last resort
# What a class without a fit of its own may be priced by instead (``resolve``).
COMPOSITE = "composite"  # a mixed step: the prefill fit plus the decode slopes
GRAPH_FROM_EAGER = "graph_from_eager"  # a graph prefill: the eager prefill fit's compute part
MODES = ("sequential", "overlapped")  # how a step was launched (``model_step.overlapped``)
KV, LONGEST = "decode_kv_tokens", "decode_longest_tokens"
_MIXED_SETS = (("prefill_tokens", KV),
               ("prefill_tokens", "prefill_attn_work", "decode_seqs", KV))
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
              ((KV,), ("padded_batch_size", KV), ("decode_seqs", KV),
               ("padded_batch_size", "decode_seqs", KV), ("padded_batch_size", KV, LONGEST)),
              ("decode_eager", POOLED), ("prefill_graph", "decode_eager")),
    ClassSpec("decode_eager", True, "num_seqs",
              ((KV,), ("decode_seqs", KV), ("decode_seqs", KV, LONGEST)),
              ("decode_graph", POOLED), ("decode_graph",)),
    ClassSpec("mixed", True, "prefill_tokens", _MIXED_SETS, (POOLED,), ("prefill",)),
    # A mixed step replayed from a CUDA graph (where the runner captures them): no launch floor.
    ClassSpec("mixed_graph", False, "prefill_tokens", _MIXED_SETS, ("prefill_graph", POOLED),
              ("prefill_graph", "mixed")),
    ClassSpec(POOLED, False, "num_seqs", ((), *_MIXED_SETS)),
)}
STEP_CLASSES = tuple(name for name in CLASSES if name != POOLED)
EAGER_CLASSES = frozenset(name for name, spec in CLASSES.items() if spec.eager)


def step_class(kind: Any, graph_used: Any) -> Any:
    """The cost class of a step: its batch kind, split by whether a CUDA graph ran it. Given
    arrays (a step each), an array of classes."""
    if not isinstance(kind, str):
        pairs = list(zip(np.asarray(kind).astype(str).tolist(), np.asarray(graph_used).tolist()))
        named = {pair: step_class(pair[0], bool(pair[1])) for pair in set(pairs)}
        return np.array([named[pair] for pair in pairs], dtype=str)
    if kind == "decode":
        return "decode_graph" if graph_used else "decode_eager"
    if kind in ("prefill", "mixed") and graph_used:
        return f"{kind}_graph"
    return kind


def computed_tokens(padded: float, prefill_tokens: float, decode_seqs: float) -> float:
    """The ``padded_tokens`` feature: the recorded padded count of a CUDA-graph prefill, else the
    step's own tokens (a trace before the column reads 0, a calibration row before it lacks it)."""
    return padded if padded != NOT_PADDED else prefill_tokens + decode_seqs


def first_of_class(classes: np.ndarray) -> np.ndarray:
    """A mask of each class's first step (one that may pay one-off costs)."""
    mask = np.zeros(len(classes), dtype=bool)
    for name in np.unique(classes):
        mask[np.flatnonzero(classes == name)[0]] = True
    return mask


def graph_prefill_from_eager(fit: LinearFit) -> LinearFit | None:
    """A CUDA-graph prefill priced from an eager prefill fit: its compute part (one graph launch:
    no launch floor), the per-token slope charged on the padded tokens its GEMMs compute. None:
    the fit has no per-token slope (a floor alone says nothing about compute)."""
    at = FEATURES.index
    per_token = fit.coef[at("prefill_tokens")]
    if per_token <= 0:
        return None
    coef = list(fit.coef)
    coef[at("padded_tokens")] += per_token
    coef[at("prefill_tokens")] = 0.0
    features = tuple(dict.fromkeys(
        "padded_tokens" if name == "prefill_tokens" else name for name in fit.features))
    return LinearFit(fit.intercept, tuple(coef), features, 0,
                     prefill_longest_s=fit.prefill_longest_s)


def composite_mixed(fits: Mapping[str, LinearFit]) -> LinearFit:
    """A mixed step as its prefill part (the prefill fit) plus its decode part (the decode
    slopes), the prefill fit's intercept and floor (it runs eagerly). Prefill sequences are
    ``num_seqs - decode_seqs``: the per-sequence slope moves onto ``num_seqs`` and back."""
    prefill = fits["prefill"]
    decode = fits.get("decode_eager") or fits.get("decode_graph")
    coef = list(prefill.coef)
    if decode is not None:
        at = FEATURES.index
        # A mixed step runs eager: a graph fit's padding slope is paid per real sequence.
        per_decode_seq = decode.coef[at("decode_seqs")] + decode.coef[at("padded_batch_size")]
        coef[at("decode_seqs")] = per_decode_seq - prefill.coef[at("num_seqs")]
        for name in (KV, LONGEST, "decode_context_tokens"):  # the last: ``shared_reads.split``
            coef[at(name)] = decode.coef[at(name)]
    return LinearFit(prefill.intercept, tuple(coef), prefill.features, 0, prefill.floor,
                     prefill.prefill_longest_s)


def resolve(fits: Mapping[str, LinearFit], cls_name: str) -> str:
    """The fit a class uses: its own, else ``COMPOSITE`` (mixed), ``GRAPH_FROM_EAGER`` (a graph
    prefill, where the eager prefill fit has a compute slope) or a related class's."""
    if cls_name in fits:
        return cls_name
    if cls_name == "mixed" and "prefill" in fits:
        return COMPOSITE
    if cls_name == "mixed_graph" and "prefill_graph" not in fits:
        return resolve(fits, "mixed")  # an eager mixed step bounds a graph one from above
    if cls_name == "prefill_graph" and "prefill" in fits and graph_prefill_from_eager(
            fits["prefill"]) is not None:
        return GRAPH_FROM_EAGER
    for other in CLASSES[cls_name].fallbacks:
        if other in fits:
            return other
    return next(iter(fits))


def class_fit(fits: Mapping[str, LinearFit], cls_name: str) -> LinearFit:
    """The fit ``resolve`` picks for a class, combined where it says so."""
    key = resolve(fits, cls_name)
    if key == COMPOSITE:
        return composite_mixed(fits)
    if key == GRAPH_FROM_EAGER:
        graph = graph_prefill_from_eager(fits["prefill"])
        assert graph is not None  # resolve checked
        return graph
    return fits[key]


@dataclass
class Steps:
    """Steps to fit, one row each: a trace's own steps, then its calibration steps. ``time``: what
    the class fits are of, the device time where the trace measured host time, else the interval
    (a calibration step's: its executor call plus the run's typical engine work around a step)."""

    x: np.ndarray  # (steps x len(FEATURES)) features
    classes: np.ndarray
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


def step_intervals(events: RecordedEvents, add: AddCost | None = None) -> np.ndarray:
    """Wall seconds each step took, from the later of the previous step's end and the latest
    arrival added before it (so an idle gap waiting for requests is not counted); ``add``: less
    what it charges the adds made in that time (``arrivals.adds_within``), which the simulator
    charges as it feeds them, so a step's own interval does not count them again."""
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
    began = np.maximum(previous, latest)
    interval = end - began
    if add is not None and add.samples:
        interval = np.maximum(interval - adds_within(events, add, steps, began), MIN_STEP_S)
    bad = ~np.isfinite(interval) | (interval <= 0)
    interval[bad] = np.asarray(ms["duration_s"], dtype=float)[bad]
    return interval


def _feature_matrix(columns: Mapping[str, Any], n: int, longest_context: np.ndarray,
                    kv_heads: int, longest_prefill: np.ndarray,
                    rereads: np.ndarray | None = None,
                    new_squared: np.ndarray | None = None) -> np.ndarray:
    """(n x len(FEATURES)) floats from the recorded feature columns and each step's longest
    decode and prefill context. Its KV tokens read (``decode_kv_tokens``) are its decode context
    less ``rereads``, the tokens of blocks another decode row of the step reads too (None: none;
    a recording names no blocks per step: exact where no two decode rows share a prefix
    block). ``new_squared``: each step's prompts' new tokens squared, summed: its attention work
    is then counted causally (``linear.causal_work``; None: as recorded)."""
    values = {name: np.asarray(columns[name], dtype=float) for name in RECORDED_FEATURES}
    if new_squared is not None:
        values["prefill_attn_work"] = causal_work(values["prefill_attn_work"],
                                                  np.asarray(new_squared, dtype=float))
    padded = columns.get(PADDED_TOKENS)
    padded = np.full(n, float(NOT_PADDED)) if padded is None else np.asarray(padded, dtype=float)
    values[PADDED_TOKENS] = np.array(
        [computed_tokens(*row) for row in zip(padded.tolist(), values["prefill_tokens"].tolist(),
                                               values["decode_seqs"].tolist())], dtype=float)
    values["decode_kv_tokens"] = values["decode_context_tokens"] - (0.0 if rereads is None
                                                                     else rereads)
    batch = values["padded_batch_size"].astype(int)
    splits = {size: choose_num_splits(size, kv_heads) for size in set(batch.tolist())}
    longest = np.where(values["decode_seqs"] > 0, np.asarray(longest_context, dtype=float), 0.0)
    values["decode_longest_tokens"] = longest / np.array([splits[b] for b in batch.tolist()],
                                                         dtype=float).reshape(n)
    values[PREFILL_LONGEST] = np.where(values["prefill_tokens"] > 0,
                                       np.asarray(longest_prefill, dtype=float), 0.0)
    return np.column_stack([values[name] for name in FEATURES]).reshape(n, len(FEATURES))


def feature_matrix(events: RecordedEvents, shared_blocks: bool = False, causal: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(n_steps x len(FEATURES)) float matrix, and the class name of each step.
    ``shared_blocks``: each step's KV read counts a block several decode rows held once, from
    the block events (``recorded_rereads``), as the simulator counts them where the model
    prices re-reads apart (``CostModel.shared_kv``); else every row's whole context.
    ``causal``: attention work counted causally (``CostOptions.causal_work``)."""
    ms = events.tables["model_step"]
    kinds = np.asarray(ms["kind"]).astype(str)
    classes = step_class(kinds, np.asarray(ms["graph_used"], dtype=bool))
    block_size = int((events.header.get("config") or {}).get("kvcache_block_size") or 0)
    rereads = recorded_rereads(events, block_size) if shared_blocks and block_size else None
    return (_feature_matrix(ms, len(kinds), longest_contexts(events),
                            kv_heads_of(events.header), longest_contexts(events, decode=False),
                            rereads, prompt_squares(events) if causal else None),
            classes)


def calibration_features(rows: list[Mapping[str, Any]], kv_heads: int = DEFAULT_KV_HEADS,
                         causal: bool = False) -> np.ndarray:
    """(rows x len(FEATURES)) features of header calibration rows (or a profile's): a row's
    longest decode context is its ``decode_context_max`` where it has one, else its decode rows
    are of one length; its prompts are of one length, over equal shares of its
    ``cached_tokens``; its decode rows fall into ``prefix_groups`` sharing ``prefix_tokens`` each
    (a profile's decodes over shared prefixes: each group's prefix read once). ``causal``: as
    ``feature_matrix``'s (its prompts of one length)."""
    columns: dict[str, Any] = {name: [row[name] for row in rows] for name in RECORDED_FEATURES}
    columns[PADDED_TOKENS] = [row.get(PADDED_TOKENS, NOT_PADDED) for row in rows]
    longest = np.array([float(row.get("decode_context_max") or -(-int(
        row["decode_context_tokens"]) // max(int(row["decode_seqs"]), 1))) for row in rows])
    prefill = np.array([-(-(int(row["prefill_tokens"]) + int(row.get("cached_tokens") or 0))
                          // max(int(row["num_seqs"]) - int(row["decode_seqs"]), 1))
                        for row in rows], dtype=float)
    rereads = np.array([float((int(row["decode_seqs"]) - int(row["prefix_groups"]))
                              * int(row.get("prefix_tokens") or 0))
                        if row.get("prefix_groups") else 0.0 for row in rows])
    squares = None
    if causal:  # prompts x (tokens / prompts)^2
        prompts = np.array([max(int(row["num_seqs"]) - int(row["decode_seqs"]), 1)
                            for row in rows], dtype=float)
        tokens = np.array([float(row["prefill_tokens"]) for row in rows])
        squares = tokens * tokens / prompts
    return _feature_matrix(columns, len(rows), longest, kv_heads, prefill, rereads, squares)


HOST_MEASURED_S = 1e-6  # a real step's host work takes microseconds at least


def has_host_times(events: RecordedEvents) -> bool:
    """Whether the trace measured each step's host work (a version-1 trace reads NaN; a recorder
    that measured nothing wrote zeros, or rounding noise)."""
    ms = events.tables["model_step"]
    if "host_s" not in ms:
        return False
    host = np.asarray(ms["host_s"], dtype=float)
    return (len(host) > 0 and bool(np.isfinite(host).all())
            and float(np.median(host)) > HOST_MEASURED_S)


def steps_of(events: RecordedEvents, host_times: bool = True, shared_blocks: bool = False,
             add: AddCost | None = None, causal: bool = False) -> Steps:
    """The trace's steps and its header's calibration steps (``calibration_steps``).
    ``host_times`` False: fitted on intervals even where the trace measured host time;
    ``shared_blocks`` and ``causal``: as ``feature_matrix``'s; ``add``: as
    ``step_intervals``'."""
    ms = events.tables["model_step"]
    x, classes = feature_matrix(events, shared_blocks, causal)
    n = len(classes)
    interval = step_intervals(events, add)
    measured_host = host_times and has_host_times(events)
    host = np.asarray(ms["host_s"], dtype=float) if measured_host else np.full(n, np.nan)
    overlapped = (np.asarray(ms["overlapped"], dtype=bool) if "overlapped" in ms
                  else np.zeros(n, dtype=bool))
    no = np.zeros(n, dtype=bool)
    own = Steps(x=x, classes=classes,
                time=np.asarray(ms["duration_s"], dtype=float) if measured_host else interval,
                host=host, interval=interval, overlapped=overlapped, is_calibration=no,
                window=no.copy())
    rows = events.header.get("calibration") or []
    if not rows:
        return own
    return own.concat(calibration_steps(rows, measured_host, engine_overhead_s(events, add),
                                        kv_heads_of(events.header), causal))


def engine_overhead_s(events: RecordedEvents, add: AddCost | None = None) -> float:
    """The median over the run's steps of the engine's own work around a step (scheduling,
    post-processing, recording): its interval (``step_intervals``) less the executor's
    duration."""
    overhead = step_intervals(events, add) - np.asarray(
        events.tables["model_step"]["duration_s"], dtype=float)
    return float(np.median(np.clip(overhead, 0.0, None))) if len(overhead) else 0.0


def calibration_steps(rows: Sequence[Mapping[str, Any]], measured_host: bool,
                      overhead_s: float, kv_heads: int = DEFAULT_KV_HEADS,
                      causal: bool = False) -> Steps:
    """Timed synthetic steps (a header's calibration rows, a device profile's) as fit rows. A
    row's ``interval_s`` times the executor call alone, less its ``wait_s`` (for the device):
    its host work. Fitted on intervals (``measured_host`` False), a row is charged
    ``overhead_s`` (``engine_overhead_s``), which a real step pays too. ``causal``: as
    ``calibration_features``'."""
    called = np.array([float(row["interval_s"]) for row in rows])
    if measured_host:
        time = np.array([float(row.get("duration_s", row["interval_s"])) for row in rows])
    else:
        time = called + overhead_s
    cal_host = np.array([np.nan if row.get("wait_s") is None
                         else float(row["interval_s"]) - float(row["wait_s"]) for row in rows])
    no = np.zeros(len(rows), dtype=bool)
    classes = step_class([row["kind"] for row in rows], [row["graph_used"] for row in rows])
    return Steps(x=calibration_features(list(rows), kv_heads, causal), classes=classes, time=time,
                 host=cal_host, interval=called, overlapped=no, is_calibration=~no,
                 window=no.copy())
