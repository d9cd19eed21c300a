"""Fidelity of a prediction: each recording of one workload predicted from each other one.

A recording under configuration B is the ground truth for a prediction of B made from a
recording under A: ``fidelity`` runs every such ordered pair and reports the relative error of
each ``FIDELITY_TARGETS`` metric and whether the decision streams are identical.
"""

from __future__ import annotations

from typing import Any

from replay.whatif.cost.model import CostModel

# Targets of the relative error of a prediction against a recording.
FIDELITY_TARGETS = {
    "throughput_tok_s": 0.03,
    "makespan_s": 0.03,
    "ttft_mean_s": 0.05,
    "tpot_p50_s": 0.05,
}


def _incomplete(trace: Any) -> str | None:
    if trace.complete:
        return None
    stopped = ("committed no step" if trace.last_step < 0
               else f"committed through step {trace.last_step}")
    return f"incomplete recording ({stopped})"


def incomplete_status(trace: Any) -> str | None:
    """The status of a row whose recording is incomplete (a killed run: its figures cover a
    prefix, so errors against them would be wrong), or None for a complete one. ``trace``:
    from ``read_trace`` or ``RecordedEvents``."""
    words = _incomplete(trace)
    return None if words is None else f"{words}: not compared"


def check_complete_source(trace: Any, path: str) -> None:
    """Raise ``ReplayLLMError`` (one line) for an incomplete source: its step-time model (and,
    for ``fidelity``, its workload) would stand for a run it did not finish."""
    from engine.errors import ReplayLLMError

    words = _incomplete(trace)
    if words is not None:
        raise ReplayLLMError(f"source {path} is an {words}: the source must be a complete "
                             "recording")


def fidelity(traces: list[str]) -> list[dict[str, Any]]:
    """Predict every trace from every other one of the same workload: per ordered pair, the
    relative error of each ``FIDELITY_TARGETS`` metric and whether decisions are identical. A
    pair with an incomplete recording has its ``incomplete_status`` (``fidelity_markdown``)."""
    from replay.metrics import compute, relative_error
    from replay.recorded import from_trace
    from replay.replayer import config_from_header
    from replay.verify import compare_decisions
    from replay.whatif.simulate import cold_start_of, load_source, run_variant
    from tracing.reader import read_trace

    events = {path: from_trace(read_trace(path)) for path in traces}
    workloads = {path: load_source(events[path]) for path in traces}
    incomplete = {path: incomplete_status(events[path]) for path in traces}
    models = {path: CostModel.fit(events[path], source=path) for path in traces
              if incomplete[path] is None}
    rows = []
    for source in traces:
        for target in traces:
            if source == target:
                continue
            if incomplete[source] or incomplete[target]:
                which = source if incomplete[source] else target
                rows.append({"source": source, "target": target,
                             "status": f"{which}: {incomplete[which]}"})
                continue
            signature = [(len(r.prompt), r.params.max_tokens) for r in workloads[source].requests]
            if signature != [(len(r.prompt), r.params.max_tokens)
                             for r in workloads[target].requests]:
                continue
            config = config_from_header(events[target].header).to_dict()
            overrides = {k: v for k, v in config.items()
                         if workloads[source].config.to_dict()[k] != v}
            predicted = run_variant(workloads[source], overrides, models[source], target,
                                    cold_start=cold_start_of(events[target].header))
            measured = compute(events[target]).summary
            row: dict[str, Any] = {"source": source, "target": target, "status": predicted.status}
            if predicted.ok and predicted.events is not None:
                for metric in FIDELITY_TARGETS:
                    row[metric] = relative_error(predicted.metrics[metric], measured[metric])
                row["decisions_identical"] = (
                    compare_decisions(events[target], predicted.events) is None
                )
            rows.append(row)
    return rows


def fidelity_markdown(rows: list[dict[str, Any]]) -> str:
    """The fidelity rows as a Markdown table (for docs/BENCHMARKS.md)."""
    names = list(FIDELITY_TARGETS)
    head = ["predicted", "from", *names, "decisions"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['target']} | {r['source']} | {r['status']} |")
            continue
        cells = [f"{100 * r[m]:+.2f}% (target {100 * FIDELITY_TARGETS[m]:.0f}%)" for m in names]
        verdict = "identical" if r["decisions_identical"] else "differ"
        lines.append(f"| {r['target']} | {r['source']} | " + " | ".join(cells)
                     + f" | {verdict} |")
    return "\n".join(lines)


# --- the validation matrix: every recorded cell predicted from one source ------------------------
# Targets of a matrix cell's relative error (per request: the median absolute TTFT error).
MATRIX_TARGETS = {
    "throughput_tok_s": 0.03,
    "makespan_s": 0.03,
    "ttft_mean_s": 0.10,
    "ttft_p50_s": 0.10,
    "ttft_p99_s": 0.20,
    "tpot_mean_s": 0.05,
    "tpot_p50_s": 0.05,
    "tpot_p99_s": 0.10,
    "request_ttft_mae": 0.15,
}
SUMMARY_METRICS = tuple(m for m in MATRIX_TARGETS if m != "request_ttft_mae")
# The repeated recordings of one cell (benchmarks/matrix.py CELLS): their spread.
SPREAD_CELLS = ("reference-default", "reference-default-2", "reference-default-3")


def _first_scheduled(events: Any) -> dict[int, int]:
    """Each request's first scheduled step (its admission)."""
    import numpy as np

    ss = events.tables["seq_scheduled"]
    seqs = np.asarray(ss["seq_id"], dtype=np.int64)
    steps = np.asarray(ss["step"], dtype=np.int64)
    unique, first = np.unique(seqs, return_index=True)
    return dict(zip(unique.tolist(), steps[first].tolist()))


def request_ttft_error(predicted: Any, measured: Any) -> float:
    """The median over requests of |predicted TTFT - recorded TTFT| / recorded TTFT (requests
    matched by id; ``compute(...).requests`` frames)."""
    import numpy as np

    joined = measured.set_index("seq_id")["ttft_s"].to_frame("measured").join(
        predicted.set_index("seq_id")["ttft_s"].to_frame("predicted"), how="inner")
    ok = np.isfinite(joined["measured"]) & np.isfinite(joined["predicted"]) & (
        joined["measured"] > 0)
    if not ok.any():
        return float("nan")
    rel = (joined["predicted"][ok] - joined["measured"][ok]).abs() / joined["measured"][ok]
    return float(np.median(rel))


def has_arrivals(events: Any) -> bool:
    """Whether requests arrived while the run stepped (then decisions depend on step times):
    added at different steps (all before the first step: a batch, however long adding took)."""
    import numpy as np

    steps = np.asarray(events.tables["request_added"]["step"], dtype=np.int64)
    return bool(len(steps)) and int(steps.max()) != int(steps.min())


def matrix_rows(targets: list[str], source: str, profile: Any = None,
                options: Any = None, target_host: bool = False) -> list[dict[str, Any]]:
    """Each target recording predicted from ``source``'s step-time model (and ``profile``, a
    device profile; ``options``: ``CostOptions``) under the target's own workload, arrivals and
    Config: per target the relative error of each ``MATRIX_TARGETS`` metric, whether decisions
    are identical (a workload without arrivals) and how many requests were admitted at another
    step than recorded (with arrivals); then a ``spread`` row where ``SPREAD_CELLS`` are among
    the targets, and one per cell recorded again as ``CELL-r2``, ``CELL-r3`` (``REPEAT_MARK``).
    A target that cannot be predicted has its ``status``. ``target_host``: each target priced
    on its own host, measured by its header's start-up calibration (``CostModel.on_host``;
    the ratio in ``host_ratio``). ``device_note``: where the target ran on another device than
    the source (``notes.device_note``), else None. An incomplete target (a killed run) has its
    ``incomplete_status`` and no errors; an incomplete source raises ``ReplayLLMError``."""
    from pathlib import Path

    from replay.metrics import compute
    from replay.recorded import from_trace
    from replay.whatif.notes import device_note
    from replay.whatif.simulate import cold_start_of, load_source, run_variant
    from tracing.reader import read_trace

    source_trace = read_trace(source)
    check_complete_source(source_trace, source)
    model = CostModel.fit(from_trace(source_trace), source=source, profile=profile,
                          options=options)
    rows: list[dict[str, Any]] = []
    recorded: dict[str, Any] = {}
    for target in targets:
        trace = read_trace(target)
        status = incomplete_status(trace)
        if status is not None:  # its figures cover a prefix: no errors, and out of the spread
            rows.append({"kind": "prediction", "target": Path(target).name, "source": source,
                         "status": status})
            continue
        events = from_trace(trace)
        measured = compute(events)
        recorded[Path(target).name] = measured.summary
        priced = (model.on_host(events.header.get("calibration") or [], Path(target).name)
                  if target_host else model)
        predicted = run_variant(load_source(events), {}, priced, Path(target).name,
                                cold_start=cold_start_of(events.header))
        row: dict[str, Any] = {"kind": "prediction", "target": Path(target).name,
                               "source": source, "status": predicted.status,
                               "requests": len(measured.requests), "notes": predicted.notes,
                               "device_note": device_note(model, events.header),
                               "host_ratio": priced.host.ratio if priced.host else None}
        if predicted.ok and predicted.events is not None:
            row.update(_errors(predicted.metrics, predicted.requests, predicted.events,
                               measured, events))
        rows.append(row)
    groups = [list(SPREAD_CELLS)] + [
        [name, *[n for n in recorded if n.startswith(f"{name}{REPEAT_MARK}")]]
        for name in recorded if REPEAT_MARK not in name]
    for names in groups:
        if len(names) > 1 and all(name in recorded for name in names):
            rows.append(spread_row([recorded[name] for name in names], names))
    return rows


def _errors(summary: dict[str, float], requests: Any, other: Any, measured: Any,
            events: Any) -> dict[str, Any]:
    """One run (``summary``, ``requests`` frame and events ``other``: a prediction, or another
    recording) against a recording (``measured = compute(events)``): each ``MATRIX_TARGETS``
    metric's relative error, and whether decisions are identical (no arrivals) or how many
    requests were admitted at another step (arrivals)."""
    from replay.metrics import relative_error
    from replay.verify import compare_decisions

    row: dict[str, Any] = {m: relative_error(summary[m], measured.summary[m])
                           for m in SUMMARY_METRICS}
    row["request_ttft_mae"] = request_ttft_error(requests, measured.requests)
    row["arrivals"] = has_arrivals(events)
    if row["arrivals"]:
        mine, theirs = _first_scheduled(other), _first_scheduled(events)
        row["admitted_elsewhere"] = sum(mine.get(seq) != step for seq, step in theirs.items())
        row["decisions_identical"] = None
    else:
        row["admitted_elsewhere"] = None
        row["decisions_identical"] = compare_decisions(events, other) is None
    return row


def machine_spread_rows(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The spread between machines: per pair (a recording, the same cell recorded in another
    device call), the second's recorded metrics against the first's, as ``matrix_rows`` reads a
    prediction (``matrix_markdown`` prints them), with ``host_ratio`` the second's host speed
    over the first's by their start-up calibrations (``host_speed.host_speed``)."""
    from pathlib import Path

    from replay.metrics import compute
    from replay.recorded import from_trace
    from replay.whatif.cost.host_speed import calibration_hosts, host_speed
    from tracing.reader import read_trace

    rows = []
    for first, second in pairs:
        traces = read_trace(first), read_trace(second)
        status = incomplete_status(traces[0]) or incomplete_status(traces[1])
        if status is not None:
            which = first if incomplete_status(traces[0]) else second
            rows.append({"kind": "machine", "target": Path(first).name, "source": second,
                         "status": f"{which}: {status}"})
            continue
        events, other = from_trace(traces[0]), from_trace(traces[1])
        measured, again = compute(events), compute(other)
        speed = host_speed(calibration_hosts(events.header.get("calibration") or []),
                           other.header.get("calibration") or [], second)
        row: dict[str, Any] = {"kind": "machine", "target": Path(first).name, "source": second,
                               "status": "ok", "requests": len(measured.requests),
                               "host_ratio": speed.ratio}
        row.update(_errors(again.summary, again.requests, other, measured, events))
        rows.append(row)
    return rows


REPEAT_MARK = "-r"  # CELL-r2, CELL-r3: repeated recordings of CELL (benchmarks/matrix.py --repeat)


def spread_row(summaries: list[dict[str, float]],
               names: list[str] | tuple[str, ...] = SPREAD_CELLS) -> dict[str, Any]:
    """The run-to-run spread of repeated recordings of one cell: per metric, the largest
    relative difference of a repeat from the first recording (signed by the larger)."""
    from replay.metrics import relative_error

    row: dict[str, Any] = {"kind": "spread", "target": " / ".join(names),
                           "source": "repeats", "status": "ok"}
    for metric in SUMMARY_METRICS:
        diffs = [relative_error(s[metric], summaries[0][metric]) for s in summaries[1:]]
        row[metric] = max(diffs, key=abs)
    row["request_ttft_mae"] = None
    return row


def _cell(value: Any, target: float | None) -> str:
    if value is None:
        return "–"
    mark = "" if target is None or abs(value) <= target else " ✗"
    return f"{100 * value:+.1f}%{mark}"


def matrix_markdown(rows: list[dict[str, Any]],
                    host_label: str = "host (own calibration)") -> str:
    """The matrix rows as a Markdown table: one column per ``MATRIX_TARGETS`` metric (✗: past
    its target, given in the header), decisions and admissions last; where cells were priced
    on their own hosts (``matrix_rows(target_host=True)``), each host's speed after the name;
    each distinct ``device_note`` below the table."""
    names = list(MATRIX_TARGETS)
    hosts = any(r.get("host_ratio") is not None for r in rows)
    head = ["cell", *([host_label] if hosts else []),
            *[f"{m} (±{100 * t:.0f}%)" for m, t in MATRIX_TARGETS.items()],
            "decisions / admitted elsewhere"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['target']} | {r['status']} |" + " |" * (len(head) - 2))
            continue
        spread = r["kind"] == "spread"
        cells = [_cell(r.get(m), None if spread else MATRIX_TARGETS[m]) for m in names]
        if spread:
            verdict = "run-to-run spread"
        elif r.get("decisions_identical") is not None:
            verdict = "identical" if r["decisions_identical"] else "differ"
        else:
            verdict = f"{r['admitted_elsewhere']} of {r['requests']} requests"
        if hosts:
            ratio = r.get("host_ratio")
            cells.insert(0, f"x{ratio:.2f}" if ratio is not None else "–")
        lines.append(f"| {r['target']} | " + " | ".join(cells) + f" | {verdict} |")
    devices = sorted({r["device_note"] for r in rows if r.get("device_note")})
    return "\n".join(lines + [f"\nnote: {note}" for note in devices])
