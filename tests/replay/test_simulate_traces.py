"""The what-if simulator on the committed traces (``traces/*``), CPU and GPU.

What these tests prove, on real recordings:
- a trace simulated under its own config reproduces its own decisions (any trace: its tokens are
  its own, so even token-dependent decisions such as EOS match);
- decision fidelity across configs: for two traces of the same workload whose decisions do not
  depend on token values (every request added before step 0, ignore_eos), each predicted from
  the other makes exactly the other's decisions;
- time fidelity on the H200 traces (``traces/h200-*``), both directions: throughput and makespan
  within 3%, mean TTFT and p50 TPOT within 5% (``replay.bench_whatif.FIDELITY_TARGETS``).
Skipped, with the reason, where no such traces are committed.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from replay.bench_whatif import FIDELITY_TARGETS, fidelity
from replay.decisions import compare_decisions
from replay.metrics import has_timings
from replay.recorded import RecordedEvents, from_trace
from replay.simulate import simulate

# REPLAYLLM_TRACES points the tests at other traces (e.g. fresh GPU recordings before commit).
TRACES = Path(os.environ.get("REPLAYLLM_TRACES", Path(__file__).resolve().parents[2] / "traces"))
GPU_PREFIX = "h200"


def committed() -> list[Path]:
    return sorted(p.parent for p in TRACES.glob("*/run.json"))


@cache
def load(path: Path) -> RecordedEvents:
    from tracing.reader import read_trace

    return from_trace(read_trace(path))


def signature(events: RecordedEvents) -> tuple:
    added = events.tables["request_added"]
    return tuple(zip(np.asarray(added["prompt_len"]).tolist(),
                     np.asarray(added["max_tokens"]).tolist()))


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
    config = target_events.header["config"]
    overrides = {k: v for k, v in config.items() if source_events.header["config"].get(k) != v}
    result = simulate(source_events, overrides, timing=None)
    assert result.ok, result.status
    assert result.events is not None
    assert compare_decisions(target_events, result.events) is None


@pytest.mark.skipif(len(GPU) < 2, reason="needs two committed H200 traces (traces/h200-*)")
def test_time_fidelity_on_the_h200_traces_both_directions() -> None:
    timed = [str(p) for p in GPU if has_timings(load(p))]
    rows = fidelity(timed)
    assert rows, "the H200 traces do not share a workload"
    failures = [
        f"{r['target']} from {r['source']}: {metric} {100 * r[metric]:+.2f}% "
        f"(target {100 * limit:.0f}%)"
        for r in rows
        for metric, limit in FIDELITY_TARGETS.items()
        if r["status"] == "ok" and abs(r[metric]) > limit
    ]
    assert all(r["status"] == "ok" for r in rows), rows
    assert not failures, "\n".join(failures)
    assert all(r["decisions_identical"] for r in rows)
