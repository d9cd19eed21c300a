"""``replayllm loadgen`` against ``replayllm serve`` on loopback: open and closed loop, every
request measured on the client and recorded by the server; ``whatif TRACE --compare RESULT``
shows both with the prediction."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine" / "server"))

from server_process import ServerProcess  # noqa: E402

from replay.cli.main import main  # noqa: E402
from replay.loadgen.result import read_result  # noqa: E402
from tracing import read_trace  # noqa: E402

NUM_REQUESTS = 12


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wl") / "w.jsonl"
    lines = [json.dumps({"prompt_token_ids": list(range(10 + i, 30 + 3 * i)),
                         "max_tokens": 4 + i % 5, "temperature": 0.0, "ignore_eos": True,
                         "arrival_s": 0.05 * i}) for i in range(NUM_REQUESTS)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_open_and_closed_loop(workload: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    server = ServerProcess(tmp_path / "trace")
    try:
        assert main(["loadgen", str(workload), "--url", server.url,
                     "--out", str(tmp_path / "open.parquet")]) == 0
        assert main(["loadgen", str(workload), "--url", server.url, "--max-concurrency", "3",
                     "--out", str(tmp_path / "closed.parquet")]) == 0
    finally:
        server.terminate()
    table = capsys.readouterr().out
    assert "TTFT mean ms" in table and "client" in table
    for name in ("open", "closed"):
        frame, summary, run = read_result(tmp_path / f"{name}.parquet")
        assert len(frame) == NUM_REQUESTS
        assert (frame["error"] == "").all()
        assert frame["completion_tokens"].tolist() == [4 + i % 5 for i in range(NUM_REQUESTS)]
        assert (frame["ttft_s"] > 0).all() and (frame["e2e_s"] >= frame["ttft_s"]).all()
        assert summary["completion_tokens"] == frame["completion_tokens"].sum()
        assert summary["throughput_tok_s"] > 0
        # One gap between content chunks; a stream behind the engine sends what piled up as
        # one chunk, so a request has at most a chunk per token.
        assert all(0 <= len(itl) <= n - 1 for itl, n in zip(frame["itl_s"],
                                                           frame["completion_tokens"]))
        assert sum(map(len, frame["itl_s"])) > 0
    _, _, run = read_result(tmp_path / "closed.parquet")
    assert run["max_concurrency"] == 3
    trace = read_trace(tmp_path / "trace")
    assert trace.table("request_added").num_rows == 2 * NUM_REQUESTS
    # Each recorded arrival lies between the client's send and its first token (on a common
    # clock; differences to request 0 cancel the two clocks' offset).
    frame, _, _ = read_result(tmp_path / "open.parquet")
    frame = frame.sort_values("sent_s")
    added = trace.table("request_added").to_pandas()["arrival_s"].to_numpy()[:NUM_REQUESTS]
    sent = frame["sent_s"].to_numpy() - frame["sent_s"].iloc[0]
    recorded = added - added[0]
    slack = 1e-3
    assert (recorded <= sent + frame["ttft_s"].to_numpy() + slack).all()
    assert (recorded >= sent - frame["ttft_s"].iloc[0] - slack).all()
    # The open loop never sends early: request i goes at or after 0.05 * i s.
    assert (frame["sent_s"] >= frame["index"] * 0.05 - slack).all()

    assert main(["whatif", str(tmp_path / "trace"), "--compare", str(tmp_path / "open.parquet"),
                 "--no-plots", "--out", str(tmp_path / "whatif")]) == 0
    out = capsys.readouterr().out
    assert "recorded" in out and "predicted" in out and "client" in out


def test_an_unreachable_server_is_one_clear_error(workload: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from server_process import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["loadgen", str(workload), "--url", url, "--out", str(tmp_path / "x")]) == 2
    assert "cannot reach" in capsys.readouterr().err
