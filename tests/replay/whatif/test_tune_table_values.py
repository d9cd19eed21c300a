"""``tune``'s printed table never shows ``nan`` and never rounds a real goodput to 0.00.

A TPOT SLO on a workload whose requests each make one token has no value: the table printed
``nan`` in its column (the HTML page, which embeds the table, too), where ``whatif``'s tables
say ``n/a``. A workload spread over hours serves about 1e-05 requests/s: every configuration's
goodput printed ``0.00``, meeting or not, and so did the best's (``goodput 0.00 req/s``). These
tests build ``TuneResult``s by hand and read the table.
"""

from __future__ import annotations

import math

from engine.config import Config
from replay.whatif.simulate import OK, SimResult
from replay.whatif.tune import Evaluation, Slo, TuneResult
from replay.whatif.tune_report import rate, table

SLOS = (Slo("e2e_p99", 10.0), Slo("tpot_p99", 1.0))


def _evaluation(makespan_s: float, overrides: dict) -> Evaluation:
    metrics = {"requests": 6.0, "rejected": 0.0, "makespan_s": makespan_s,
               "throughput_tok_s": 18 / makespan_s, "e2e_p99_s": 0.5, "tpot_p99_s": math.nan}
    return Evaluation(overrides, SimResult("x", overrides, OK, True, metrics), 6, SLOS)


def test_a_metric_without_value_is_n_a_not_nan() -> None:
    """One-token answers have no TPOT: its cell reads ``n/a``; no cell reads ``nan``."""
    base = _evaluation(20.0, {})
    text = table(TuneResult(SLOS, [base], base, Config()))
    assert "nan" not in text.lower()
    assert text.splitlines()[1].split()[-2:] == ["500.00", "n/a"]


def test_slow_rates_keep_their_digits() -> None:
    """6 requests over a week: 9.92e-06 req/s, not 0.00; ordinary rates keep two decimals."""
    week = _evaluation(604_800.0, {})
    only_e2e = (SLOS[0],)
    week = Evaluation({}, week.result, 6, only_e2e)
    text = table(TuneResult(only_e2e, [week], week, Config()))
    row = text.splitlines()[1].split()
    assert row[3:5] == ["9.92e-06", "9.92e-06"], text  # goodput, req/s (it meets e2e_p99)
    assert rate(1.5) == "1.50" and rate(0.0) == "0.00" and rate(math.nan) == "n/a"
