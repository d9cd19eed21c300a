"""``workload describe``'s table for arrivals at extreme scales (session 32, docs/TESTING.md)."""

from __future__ import annotations

import pytest

from replay.workloads.describe import summarize, table
from replay.workloads.request import Request


@pytest.mark.parametrize("gap, span, rate", [(1e-300, "2.000e-300 s", "1.000e+300 req/s"),
                                             (1e-5, "2.000e-05 s", "100,000.000 req/s"),
                                             (2.5, "5.000 s", "0.400 req/s")])
def test_rates_of_tiny_spans_are_short_numbers(gap: float, span: str, rate: str) -> None:
    """A workload imported with ``--time-scale 1e-300`` (arrivals 1e-300 s apart) printed
    rates of 300 digits and a span of '0.000 s'; now numbers outside [0.001, 1e12) print in
    scientific notation, the others as before."""
    requests = [Request([1, 2, 3], 4, arrival_s=i * gap) for i in range(3)]
    text = table(summarize(iter(requests), 16))
    assert max(len(line) for line in text.splitlines()) < 110, text
    lines = dict(line.split(None, 1) if not line.startswith(" ") else (line, "")
                 for line in text.splitlines() if line[:4] in ("time", "mean"))
    assert lines["time"] == f"span              {span} (first-turn arrivals)"
    assert lines["mean"] == f"rate              {rate}"
