"""Policies on the H200 traces (issue 17): what-if under ``priority`` and LRU eviction, and the
check of one prediction against an H200 recording of the same setting.

    python -m benchmarks.policies workload FILE        # the prioritised reference workload
    python -m benchmarks.policies whatif               # the table of docs/policies.md (CPU)
    python -m benchmarks.policies fidelity TRACE ... [--source TRACE] [--profile PROFILE]

The reference workload carries no priorities, so ``priority`` alone changes nothing on it: the
what-if gives a third of the same requests high priority (``priorities``: a seeded sample, the
same on the CPU and on the device) and runs them under ``priority``. ``fidelity`` predicts each
recording from the source's step-time model under the recording's own workload (its priorities
included) and Config (``replay.whatif.fidelity.matrix_rows``, the validation matrix's check),
and adds the TTFT of each priority class, predicted and measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from pathlib import Path
from typing import Any

# Priorities: lower is served first (engine.policy.Step.priority). A third of the requests high.
PRIORITY_SEED = 17
HIGH, LOW = 0, 1
HIGH_SHARE = 3  # one request in HIGH_SHARE
REFERENCE = "traces/h200-reference-s4"
CONSTRAINED = "traces/h200-constrained"
# Setting -> (source trace, Config overrides, whether the requests carry the priorities). The
# baselines carry them too: ``prefill_first`` ignores them, so their metrics are the trace's own
# configuration's, and the TTFT of each class is what ``priority`` changes.
SETTINGS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "reference": (REFERENCE, {}, True),
    "reference priority": (REFERENCE, {"policy": "priority"}, True),
    "reference lru": (REFERENCE, {"eviction": "lru"}, False),
    "constrained": (CONSTRAINED, {}, True),
    "constrained priority": (CONSTRAINED, {"policy": "priority"}, True),
    "constrained lru": (CONSTRAINED, {"eviction": "lru"}, False),
}
COLUMNS = ("throughput_tok_s", "ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s",
           "tpot_p50_s", "tpot_p99_s", "preemptions", "prefix_hit_rate", "steps")


def priorities(num_requests: int) -> list[int]:
    """Each request's priority: ``num_requests // HIGH_SHARE`` of them, a sample seeded with
    ``PRIORITY_SEED``, get ``HIGH``; the rest ``LOW``."""
    high = set(random.Random(PRIORITY_SEED).sample(range(num_requests),
                                                   num_requests // HIGH_SHARE))
    return [HIGH if i in high else LOW for i in range(num_requests)]


def priority_workload() -> list[Any]:
    """DESIGN.md's reference workload with ``priorities`` (what the device records)."""
    from replay.workloads.builtin import reference_workload

    requests = reference_workload()
    return [dataclasses.replace(r, priority=p)
            for r, p in zip(requests, priorities(len(requests)))]


def prioritised(workload: Any) -> Any:
    """A trace's ``SimWorkload`` with ``priorities`` on its requests (in the order added)."""
    ranks = priorities(len(workload.requests))
    requests = [dataclasses.replace(r, priority=p) for r, p in zip(workload.requests, ranks)]
    return dataclasses.replace(workload, requests=requests)


def class_ttft(events: Any, requests: Any) -> dict[str, float]:
    """Mean and p50 TTFT of each priority class (``events``: its request_added; ``requests``:
    the per-request metrics frame)."""
    import numpy as np

    added = events.tables["request_added"]
    rank = {int(seq): events.request_priority(row)
            for row, seq in enumerate(np.asarray(added["seq_id"]).tolist())}
    ttft = requests["ttft_s"].to_numpy(dtype=float)
    klass = np.array([rank[int(s)] for s in requests["seq_id"]])
    out = {}
    for name, value in (("high", HIGH), ("low", LOW)):
        chosen = ttft[klass == value]
        if len(chosen):
            out[f"ttft_mean_{name}_s"] = float(chosen.mean())
            out[f"ttft_p50_{name}_s"] = float(np.percentile(chosen, 50))
    return out


def whatif(settings: list[str]) -> list[dict[str, Any]]:
    """Each setting predicted from its source trace's own step-time model: its metrics and,
    where the requests carry priorities, the TTFT of each class."""
    from replay.whatif.simulate import load_source, load_timing, run_variant

    rows, sources = [], {}
    for name in settings:
        trace, overrides, with_priorities = SETTINGS[name]
        if trace not in sources:
            workload = load_source(trace)
            sources[trace] = (workload, load_timing("auto", workload)[0])
        workload, cost = sources[trace]
        if with_priorities:
            workload = prioritised(workload)
        result = run_variant(workload, overrides, cost, name)
        row = {"setting": name, "status": result.status, **result.metrics}
        if result.ok and with_priorities:
            row.update(class_ttft(result.events, result.requests))
        rows.append(row)
    return rows


def _value(metric: str, value: float | None) -> str:
    if value is None:
        return "–"
    if metric == "prefix_hit_rate":
        return f"{value:.3f}"
    if metric.endswith("_s") and metric != "throughput_tok_s":
        return f"{1000 * value:.1f}" if "ttft" in metric else f"{1000 * value:.2f}"
    return f"{value:.0f}"


def whatif_markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (times in ms), the TTFT of each priority class last."""
    extra = ("ttft_mean_high_s", "ttft_mean_low_s", "ttft_p50_high_s", "ttft_p50_low_s")
    head = ["setting", *COLUMNS, "ttft_mean high / low", "ttft_p50 high / low"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if row["status"] != "ok":
            lines.append(f"| {row['setting']} | {row['status']} |" + " |" * (len(head) - 2))
            continue
        cells = [_value(m, row.get(m)) for m in COLUMNS]
        classes = [_value("ttft_s", row.get(m)) for m in extra]
        cells += [f"{classes[0]} / {classes[1]}", f"{classes[2]} / {classes[3]}"]
        lines.append(f"| {row['setting']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fidelity(traces: list[str], source: str, profile: str | None) -> str:
    """The validation matrix's table for ``traces`` predicted from ``source``, then each
    priority class's TTFT, predicted and measured."""
    from replay.metrics import compute
    from replay.recorded import from_trace
    from replay.whatif.cost.model import CostModel
    from replay.whatif.fidelity import matrix_markdown, matrix_rows
    from replay.whatif.simulate import cold_start_of, load_source, run_variant
    from tracing.reader import read_trace

    lines = [matrix_markdown(matrix_rows(traces, source, profile)), ""]
    model = CostModel.fit(from_trace(read_trace(source)), source=source, profile=profile)
    for trace in traces:
        events = from_trace(read_trace(trace))
        if not any(events.request_priority(row)
                   for row in range(len(events.tables["request_added"]["seq_id"]))):
            continue
        measured = class_ttft(events, compute(events).requests)
        predicted = run_variant(load_source(events), {}, model, Path(trace).name,
                                cold_start=cold_start_of(events.header))
        if not predicted.ok:
            continue
        ours = class_ttft(predicted.events, predicted.requests)
        for metric, value in measured.items():
            error = (ours[metric] - value) / value
            lines.append(f"{Path(trace).name} {metric}: predicted {1000 * ours[metric]:.1f} ms, "
                         f"measured {1000 * value:.1f} ms ({100 * error:+.1f}%)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.policies",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("workload", help="write the prioritised reference workload")
    w.add_argument("out", type=Path, help="a .jsonl or .parquet file")
    s = sub.add_parser("whatif", help="the what-if table (Markdown)")
    s.add_argument("--only", nargs="*", choices=list(SETTINGS), default=list(SETTINGS))
    f = sub.add_parser("fidelity", help="recordings predicted from a source trace")
    f.add_argument("traces", nargs="+")
    f.add_argument("--source", default=CONSTRAINED)
    f.add_argument("--profile", default=None)
    args = parser.parse_args(argv)
    if args.command == "workload":
        from replay.workloads.store import WorkloadWriter

        writer = WorkloadWriter(args.out, {"note": "benchmarks.policies priority_workload"})
        count = writer.write_all(priority_workload())
        writer.close()
        print(f"wrote {args.out}: {count} requests, "
              f"{sum(p == HIGH for p in priorities(count))} high priority")
        return 0
    if args.command == "whatif":
        print(whatif_markdown(whatif(args.only)))
        return 0
    print(fidelity(args.traces, args.source, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
