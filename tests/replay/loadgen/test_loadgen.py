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


def test_conversations_send_each_turn_after_the_answer(tmp_path: Path) -> None:
    """Two 3-turn conversations (one with token-id prompts, decoded by --tokenizer) and a lone
    request, over two client processes: each later turn goes to the chat endpoint after the
    previous answer ended plus its think time, its prompt the history, the answer and the new
    user turn (the recorded prompt of turn k extends that of turn k - 1)."""
    from engine.model.checkpoint import default_model_dir

    think = 0.2
    lines = [{"prompt": "lone request", "max_tokens": 3, "temperature": 0.0,
              "ignore_eos": True}]
    for c, conversation in enumerate(("a", "b")):
        for turn in range(3):
            line = {"max_tokens": 4 + turn, "temperature": 0.0, "ignore_eos": True,
                    "conversation_id": conversation, "turn": turn,
                    "arrival_s": 0.0 if turn == 0 else None,
                    "think_time_s": think if turn else None}
            if c == 0:
                line["prompt"] = f"conversation {conversation}, user turn {turn}"
            else:
                line["prompt_token_ids"] = [100 + 10 * turn + k for k in range(6)]
            lines.append({k: v for k, v in line.items() if v is not None})
    workload = tmp_path / "conv.jsonl"
    workload.write_text("".join(json.dumps(line) + "\n" for line in lines))
    server = ServerProcess(tmp_path / "trace")
    try:
        assert main(["loadgen", str(workload), "--url", server.url, "--workers", "2",
                     "--tokenizer", str(default_model_dir()),
                     "--out", str(tmp_path / "conv.parquet")]) == 0
    finally:
        server.terminate()
    frame, _, run = read_result(tmp_path / "conv.parquet")
    assert run["workers"] == 2 and (frame["error"] == "").all()
    assert frame["completion_tokens"].tolist() == [3, 4, 5, 6, 4, 5, 6]
    for first in (1, 4):  # each conversation's turns 1 and 2
        for i in (first + 1, first + 2):
            ended = frame["sent_s"][i - 1] + frame["e2e_s"][i - 1]
            assert frame["sent_s"][i] >= ended + think - 1e-3
    added = read_trace(tmp_path / "trace").table("request_added").to_pandas()
    prompts = [list(p) for p in added.sort_values("arrival_s")["prompt_token_ids"]]
    assert len(prompts) == 7
    # Turns 1 and 2 of each conversation (4 prompts) start with an earlier prompt of theirs
    # (but its last token, which the answer's text may merge with); the lone request and the
    # two first turns extend none.
    extending = [p for p in prompts
                 if any(len(q) < len(p) and p[:len(q) - 1] == q[:-1] for q in prompts)]
    assert len(extending) == 4


def test_a_stalled_stream_fails_after_the_stall_timeout(workload: Path, tmp_path: Path) -> None:
    """A server that lists its model, then never answers a completion: each request fails with
    a read timeout after ``--stall-timeout`` instead of hanging the run."""
    import asyncio
    import threading
    import time

    from server_process import free_port

    port = free_port()
    ready = threading.Event()
    stop: list[asyncio.AbstractEventLoop] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        if request.startswith(b"GET /v1/models"):
            body = b'{"data": [{"id": "m"}]}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        await asyncio.sleep(3600)  # a completion: silence

    def serve() -> None:
        async def main_() -> None:
            stop.append(asyncio.get_running_loop())
            await asyncio.start_server(handle, "127.0.0.1", port)
            ready.set()
            await asyncio.sleep(3600)
        try:
            asyncio.run(main_())
        except RuntimeError:
            pass  # the loop stopped from the test

    threading.Thread(target=serve, daemon=True).start()
    assert ready.wait(10)
    began = time.perf_counter()
    status = main(["loadgen", str(workload), "--url", f"http://127.0.0.1:{port}",
                   "--num-requests", "2", "--stall-timeout", "1", "--out", str(tmp_path / "r")])
    assert status == 1 and time.perf_counter() - began < 30
    frame, _, _ = read_result(tmp_path / "r")
    assert len(frame) == 2
    assert all("timed out" in e and "--stall-timeout" in e for e in frame["error"])
    stop[0].call_soon_threadsafe(stop[0].stop)
