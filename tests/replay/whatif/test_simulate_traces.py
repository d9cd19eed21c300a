"""The what-if simulator on the committed traces (``traces/*``), CPU and GPU.

What these tests prove, on real recordings:
- a trace simulated under its own config reproduces its own decisions (any trace: its tokens are
  its own, so even token-dependent decisions such as EOS match);
- decision fidelity across configs: for two traces of the same workload whose decisions do not
  depend on token values (every request added before step 0, ignore_eos), each predicted from
  the other makes exactly the other's decisions;
- time fidelity on the H200 traces (``traces/h200-*``), both directions: throughput and makespan
  within 3%, mean TTFT and p50 TPOT within 5% (``benchmarks.whatif.FIDELITY_TARGETS``), one
  assertion per direction and metric; those still missed are strict xfails that give the
  measured figures and the reason, and a regression test keeps every error from growing beyond
  what was measured.
Skipped, with the reason, where no such traces are committed.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from replay.metrics import has_timings
from replay.recorded import RecordedEvents, from_trace
from replay.replayer import config_from_header
from replay.verify import compare_decisions
from replay.whatif.fidelity import FIDELITY_TARGETS, fidelity
from replay.whatif.simulate import simulate

# REPLAYLLM_TRACES points the tests at other traces (e.g. fresh GPU recordings before commit).
TRACES = Path(os.environ.get("REPLAYLLM_TRACES", Path(__file__).resolve().parents[3] / "traces"))
GPU_PREFIX = "h200"


def committed() -> list[Path]:
    return sorted(p.parent for p in TRACES.glob("*/run.json"))


@cache
def load(path: Path) -> RecordedEvents:
    from tracing.reader import read_trace

    return from_trace(read_trace(path))


def signature(events: RecordedEvents) -> tuple:
    """The workload as far as decisions go: prompt lengths, max_tokens and priorities (a trace
    whose requests carry other priorities is another workload, not another config)."""
    added = events.tables["request_added"]
    lens = np.asarray(added["prompt_len"])
    priority = added.get("priority")
    priorities = np.zeros(len(lens), int) if priority is None else np.asarray(priority)
    return tuple(zip(lens.tolist(), np.asarray(added["max_tokens"]).tolist(),
                     priorities.tolist()))


def token_independent(events: RecordedEvents) -> bool:
    added = events.tables["request_added"]
    return bool((np.asarray(added["step"]) == 0).all() and np.asarray(added["ignore_eos"]).all())


def pairs(prefix: str = "") -> list[tuple[Path, Path]]:
    found = [p for p in committed() if p.name.startswith(prefix)]
    return [(a, b) for a in found for b in found
            if a != b and signature(load(a)) == signature(load(b))
            and token_independent(load(a)) and token_independent(load(b))]


def ids(items: list) -> list[str]:
    return [" from ".join(p.name for p in reversed(item)) if isinstance(item, tuple) else item.name
            for item in items]


SELF = committed()
CROSS = pairs()
GPU = [p for p in committed() if p.name.startswith(GPU_PREFIX)]
NONE = pytest.mark.skip(reason="no committed traces under traces/")


@pytest.mark.parametrize("trace", SELF or [pytest.param(None, marks=NONE)], ids=ids(SELF) or None)
def test_a_trace_simulated_under_its_own_config_makes_its_own_decisions(trace: Path) -> None:
    events = load(trace)
    result = simulate(events, {}, timing=None)
    assert result.ok, result.status
    assert result.events is not None
    assert compare_decisions(events, result.events) is None


@pytest.mark.parametrize(
    "pair", CROSS or [pytest.param(None, marks=pytest.mark.skip(
        reason="no two committed traces of one token-independent workload"))],
    ids=ids(CROSS) or None,
)
def test_decision_fidelity_between_committed_traces(pair: tuple[Path, Path]) -> None:
    source, target = pair
    source_events, target_events = load(source), load(target)
    # As each trace runs: an older header's config gets the defaults of its release.
    config = config_from_header(target_events.header).to_dict()
    recorded = config_from_header(source_events.header).to_dict()
    overrides = {k: v for k, v in config.items() if recorded.get(k) != v}
    result = simulate(source_events, overrides, timing=None)
    assert result.ok, result.status
    assert result.events is not None
    assert compare_decisions(target_events, result.events) is None


# --- time fidelity on the H200 traces -----------------------------------------------------------
REFERENCE, CONSTRAINED = "h200-reference-s4", "h200-constrained"
FROM_REFERENCE = (CONSTRAINED, REFERENCE)  # (predicted, from)
FROM_CONSTRAINED = (REFERENCE, CONSTRAINED)
DIRECTIONS = [FROM_REFERENCE, FROM_CONSTRAINED]
NEEDS_H200 = pytest.mark.skipif(
    not {REFERENCE, CONSTRAINED} <= {p.name for p in GPU},
    reason="needs the committed H200 traces (traces/h200-reference-s4, traces/h200-constrained)")

# Where a target is still missed: the figures measured (python -m benchmarks.whatif --fidelity
# traces/h200-reference-s4 traces/h200-constrained) and why, as strict xfails (a fix that meets the
# target turns one into a failure, so the mark cannot outlive the miss). None since session 4.
MISSES: dict[tuple[tuple[str, str], str], str] = {}
# The absolute errors achieved (%), per direction. The regression test allows
# REGRESSION_MARGIN_PCT on top.
ACHIEVED_PCT = {
    # Calibration steps charged the engine's host work per step (``engine_host``): the
    # constrained target's 150 graph prefills each take 0.4 ms more (docs/BENCHMARKS.md §7).
    FROM_REFERENCE: {"throughput_tok_s": 0.84, "makespan_s": 0.84, "ttft_mean_s": 0.37,
                     "tpot_p50_s": 0.53},
    FROM_CONSTRAINED: {"throughput_tok_s": 1.04, "makespan_s": 1.05, "ttft_mean_s": 1.39,
                       "tpot_p50_s": 4.94},
}
REGRESSION_MARGIN_PCT = 0.5


@cache
def h200_rows() -> dict[tuple[str, str], dict]:
    """``bench_whatif.fidelity`` rows of the H200 traces, by (predicted, from) trace name."""
    timed = [str(p) for p in GPU if has_timings(load(p))]
    return {(Path(r["target"]).name, Path(r["source"]).name): r for r in fidelity(timed)}


def direction_id(direction: tuple[str, str]) -> str:
    return f"{direction[0]} from {direction[1]}"


CASES = [
    pytest.param(d, m, id=f"{direction_id(d)}: {m}",
                 marks=[pytest.mark.xfail(strict=True, reason=MISSES[d, m])]
                 if (d, m) in MISSES else [])
    for d in DIRECTIONS for m in FIDELITY_TARGETS
]


@NEEDS_H200
@pytest.mark.parametrize("direction,metric", CASES)
def test_time_fidelity_on_the_h200_traces_both_directions(
    direction: tuple[str, str], metric: str
) -> None:
    """The issue's targets, per direction and metric: throughput and makespan within 3%, mean
    TTFT and p50 TPOT within 5%, with identical decisions."""
    row = h200_rows()[direction]
    assert row["status"] == "ok", row["status"]
    assert row["decisions_identical"]
    limit = FIDELITY_TARGETS[metric]
    assert abs(row[metric]) <= limit, (
        f"{direction_id(direction)}: {metric} {100 * row[metric]:+.2f}% "
        f"(target {100 * limit:.0f}%)"
    )


@NEEDS_H200
@pytest.mark.parametrize("direction", DIRECTIONS, ids=direction_id)
def test_time_fidelity_on_the_h200_traces_does_not_regress(direction: tuple[str, str]) -> None:
    """Where a target is missed, the miss must not grow: every metric's error stays within what
    was measured (ACHIEVED_PCT) plus a small margin, and decisions stay identical."""
    row = h200_rows()[direction]
    assert row["status"] == "ok", row["status"]
    assert row["decisions_identical"]
    worse = [
        f"{metric} {100 * row[metric]:+.2f}% (achieved {achieved:.2f}%)"
        for metric, achieved in ACHIEVED_PCT[direction].items()
        if abs(100 * row[metric]) > achieved + REGRESSION_MARGIN_PCT
    ]
    assert not worse, f"{direction_id(direction)}: " + "; ".join(worse)
