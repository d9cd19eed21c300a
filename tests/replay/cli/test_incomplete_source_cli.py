"""A killed (incomplete) SOURCE trace under ``whatif --compare LOADGEN_RESULT`` and ``tune``:
every row covers the requests the recording finished (``replay.whatif.compare``'s one rule),
and a SOURCE with nothing to re-run is one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _cli import killed_copy

from engine.config import Config
from replay.cli.main import main as replayllm
from replay.loadgen.answer import Measured
from replay.loadgen.result import requests_frame, summarize, write_result
from replay.recorded import from_trace
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request
from tracing.reader import read_trace

NUM_SEQS = 16


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 16-request trace of ~250 steps in several committed segments."""
    path = str(tmp_path_factory.mktemp("incomplete") / "b")
    requests = [Request(r.prompt[:300], min(r.max_tokens, 120))
                for r in reference_workload(num_seqs=NUM_SEQS)]
    record_workload(Config(num_kvcache_blocks=30, kvcache_block_size=32, max_num_seqs=8),
                    requests, StepLaw(), trace_dir=path, seed=2)
    return path


def _result(path: Path, max_tokens: list[int]) -> Path:
    """A loadgen result of every request, request i sent at 0.1 i s and answered 1 s later."""
    measured = [Measured(i, 20, m, 0.1 * i, 0.1 * i, 0.1 * i + 0.05, 0.1 * i + 1.0, m, 20,
                         [0.1 * i + 0.05, 0.1 * i + 1.0], "length", token_source="usage",
                         done=True) for i, m in enumerate(max_tokens)]
    frame = requests_frame(measured)
    return write_result(path, frame, summarize(frame, 2.5), {"url": "u"})


def test_compare_loadgen_result_with_a_killed_source_covers_its_finished_requests(
        trace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SOURCE killed after finishing some of its 16 requests, RESULT a loadgen run of all 16:
    the recorded row covered those finished, the predicted row and the client row all 16
    (makespans off by the lost tail). Now all three cover the finished ones, the client's
    matched by index and its makespan up to the last of them, and the output says so."""
    killed = killed_copy(trace, tmp_path / "killed", keep=1)
    recorded = from_trace(read_trace(killed))
    finished = np.unique(recorded.tables["request_finished"]["seq_id"])
    added = np.asarray(recorded.tables["request_added"]["seq_id"])
    indices = np.flatnonzero(np.isin(added, finished)).tolist()
    assert 0 < len(finished) < len(added) == NUM_SEQS
    max_tokens = np.asarray(recorded.tables["request_added"]["max_tokens"]).tolist()
    result = _result(tmp_path / "r.parquet", max_tokens)
    assert replayllm(["whatif", killed, "--compare", str(result), "--no-plots",
                      "--out", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    assert f"the recorded row and every prediction cover only those {len(finished)}" in out
    assert f"note: the client row covers the {len(finished)} of those {len(finished)}" in out
    table = pd.read_parquet(tmp_path / "w" / "summary.parquet").set_index("source")
    assert table["requests"].tolist() == [len(finished)] * 3
    client = table.loc["client"]
    last = max(indices)
    assert client["makespan_s"] == pytest.approx(0.1 * last + 1.0 - 0.1 * min(indices))
    assert table["notes"].map(lambda n: f"{len(finished)} of {NUM_SEQS} requests" in str(n)
                              ).all()


def test_compare_loadgen_result_of_another_workload_with_a_killed_source_refuses(
        trace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The client rows cannot be matched to the finished requests when the result ran other
    requests (other max_tokens): one line, exit 2."""
    killed = killed_copy(trace, tmp_path / "killed", keep=1)
    result = _result(tmp_path / "r.parquet", [7] * NUM_SEQS)
    assert replayllm(["whatif", killed, "--compare", str(result), "--no-plots",
                      "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ran another workload than" in err
    assert "cannot be matched to the" in err


def test_compare_loadgen_result_with_a_source_that_finished_nothing_refuses(
        trace: str, tmp_path: Path) -> None:
    """A killed SOURCE that recorded requests but finished none: nothing to compare (was: a
    recorded row of no request beside 16 predicted and 16 client ones)."""
    from engine.errors import ReplayLLMError
    from replay.loadgen.result import read_result
    from replay.recorded import RecordedEvents, keep_rows
    from replay.whatif.compare import incomplete_source, scope_client
    from replay.whatif.simulate import load_source

    full = from_trace(read_trace(trace))
    finished = full.tables["request_finished"]
    none = keep_rows(finished, np.zeros(len(finished["seq_id"]), dtype=bool))
    workload = load_source(RecordedEvents(full.header, {**full.tables, "request_finished": none},
                                          100, False))
    workload.name = "killed"
    incomplete_source(workload, restrict=True)
    frame, summary, _ = read_result(_result(tmp_path / "r.parquet", [1] * NUM_SEQS))
    with pytest.raises(ReplayLLMError, match=(
            rf"^killed is incomplete \(the recording stopped; committed through step 100\) and "
            rf"finished none of the {NUM_SEQS} requests: nothing to compare$")):
        scope_client(frame, summary, workload, "r.parquet")


@pytest.mark.parametrize("command", ["tune", "whatif"])
def test_a_killed_source_that_recorded_no_request_is_refused(
        command: str, trace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Killed before its first commit: no request recorded. ``tune --timing-from`` searched
    every configuration "on 0 requests" and said none met the SLO (exit 1); ``whatif`` printed a
    table of nothing (exit 0). Now one line, exit 2."""
    killed = killed_copy(trace, tmp_path / "killed", keep=0)
    extra = ["--slo", "ttft_p99=1", "--space", "max_num_seqs=8,16"] if command == "tune" else []
    code = replayllm([command, killed, "--timing-from", trace, *extra, "--no-plots",
                      "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.strip().endswith("recorded no request: nothing to re-run")
