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


def fidelity(traces: list[str]) -> list[dict[str, Any]]:
    """Predict every trace from every other one of the same workload: per ordered pair, the
    relative error of each ``FIDELITY_TARGETS`` metric and whether decisions are identical."""
    from replay.metrics import compute, relative_error
    from replay.recorded import from_trace
    from replay.replayer import config_from_header
    from replay.verify import compare_decisions
    from replay.whatif.simulate import cold_start_of, load_source, run_variant
    from tracing.reader import read_trace

    events = {path: from_trace(read_trace(path)) for path in traces}
    workloads = {path: load_source(events[path]) for path in traces}
    models = {path: CostModel.fit(events[path], source=path) for path in traces}
    rows = []
    for source in traces:
        for target in traces:
            if source == target:
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
