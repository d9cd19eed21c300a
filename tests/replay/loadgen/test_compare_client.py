"""``whatif TRACE --compare LOADGEN_RESULT`` (``replay.whatif.compare.client_view``): a retried
request's client TTFT and e2e are counted from its accepted attempt (the server's trace never
saw the refused ones nor the waits), saying so; a partial result (Ctrl-C) is flagged as an
incomplete trace is. No server: the trace is synthetic, the result written here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from engine.config import Config
from replay.cli.main import main
from replay.loadgen.answer import Measured
from replay.loadgen.result import requests_frame, summarize, write_result
from replay.whatif.compare import client_view
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.request import Request

N = 4


def _measured(i: int, retries: int = 0, wait: float = 0.0) -> Measured:
    """Request i sent at 0.1 i s, its first token 0.05 s and its last 0.1 s after its accepted
    attempt, which came ``wait`` s after its first send."""
    sent = 0.1 * i
    start = sent + wait
    return Measured(i, 20, 3, sent, sent, start + 0.05, start + 0.1, 3, 20,
                    [start + 0.05, start + 0.075, start + 0.1], "length", token_source="usage",
                    done=True, retries=retries, retry_wait_s=wait)


def _result(retried: dict[int, float], count: int = N) -> tuple:
    frame = requests_frame([_measured(i, 1 if i in retried else 0, retried.get(i, 0.0))
                            for i in range(count)])
    return frame, summarize(frame, 1.0)


def test_retry_waits_are_left_out_and_said() -> None:
    """Request 1 waited 2 s refused: its TTFT and e2e become those of its accepted attempt
    (0.05 s, 0.1 s), so the client's mean TTFT is 0.05 s, not 0.55 s; one line says how many
    were retried and how long their waits were. Nothing retried: no line, the figures kept."""
    frame, summary = _result({1: 2.0})
    assert summary["ttft_mean_s"] == pytest.approx(0.55)
    shown, shown_summary, lines = client_view(frame, summary, {"partial": False}, "r.parquet",
                                              "trace", N)
    assert shown["ttft_s"].tolist() == pytest.approx([0.05] * N)
    assert shown["e2e_s"].tolist() == pytest.approx([0.1] * N)
    assert shown_summary["ttft_mean_s"] == pytest.approx(0.05)
    assert shown_summary["retries"] == 1 and frame["ttft_s"][1] == pytest.approx(2.05)
    assert lines == ["note: 1 of the 4 requests in r.parquet were retried (refused, or "
                     "never reaching the server): their client TTFT and e2e count from "
                     "the accepted attempt, as the server's trace does (2 s of refused attempts "
                     "and waits, retry_wait_s, left out)"]
    plain, plain_summary = _result({})
    same, same_summary, lines = client_view(plain, plain_summary, {}, "r.parquet", "trace", N)
    assert lines == [] and same_summary == plain_summary


def test_a_partial_result_is_flagged() -> None:
    """A result marked partial (Ctrl-C) holding 2 of the 4 requests planned: a warning that the
    client row covers those 2 only (was: set beside the whole trace with no word)."""
    frame, summary = _result({}, count=2)
    _, _, lines = client_view(frame, summary, {"partial": True, "requests_planned": N},
                              "r.parquet", "trace", N)
    assert lines == ["warning: r.parquet is partial (loadgen was interrupted): it holds the 2 "
                     "of the 4 requests planned that completed; the client row covers those 2 "
                     "only, the recorded and predicted rows all 4 of trace"]


def test_compare_prints_the_lines_and_notes_the_row(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Through ``replayllm whatif``: both lines printed, the client row's TTFT mean without the
    wait, and the lines in summary.parquet's notes of the client row."""
    import pandas as pd

    requests = [Request(list(range(1, 21)), 3, arrival_s=0.1 * i) for i in range(N)]
    record_workload(Config(num_kvcache_blocks=60, kvcache_block_size=16, max_num_seqs=4),
                    requests, StepLaw(), trace_dir=str(tmp_path / "trace"))
    frame, summary = _result({1: 2.0}, count=3)
    path = write_result(tmp_path / "r.parquet", frame, summary,
                        {"url": "u", "partial": True, "requests_planned": N})
    assert main(["whatif", str(tmp_path / "trace"), "--compare", str(path), "--no-plots",
                 "--out", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert "warning: " + str(path) + " is partial" in out
    assert "note: 1 of the 3 requests in" in out and "retry_wait_s, left out" in out
    table = pd.read_parquet(tmp_path / "w" / "summary.parquet")
    client = table[table["source"] == "client"].iloc[0]
    assert math.isclose(client["ttft_mean_s"], 0.05, rel_tol=1e-6)
    assert "is partial" in client["notes"] and "retried" in client["notes"]
