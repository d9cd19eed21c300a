"""``replayllm loadgen`` against servers that fail: unreachable, answering errors for some
requests, dropping the connection, too slow; and settings or files it must refuse before
sending anything. Each server is ``_fake_server.FakeServer`` on loopback, in this process."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fake_server import FakeServer, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.result import read_result


async def _ok(request: web.Request, body: dict, n: int) -> web.StreamResponse:
    return await stream(request, tokens(3))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}", "http://no-such-host.invalid:8000"])
@pytest.mark.parametrize("model", [[], ["--model", "m"]])
def test_an_unreachable_server_is_one_line_and_no_result(
        url: str, model: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Connection refused (a port nobody listens on) or a host name that does not resolve: one
    line on stderr, exit 2, no result file, with or without ``--model`` (was, with ``--model``:
    every request sent and failed, a result file written, exit 1)."""
    out = tmp_path / "r.parquet"
    status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)),
                   "--url", url.format(port=_free_port()), *model, "--out", str(out)])
    err = capsys.readouterr().err
    assert status == 2 and not out.exists()
    assert "cannot reach" in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_error_answers_are_counted_with_their_status_and_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """429 (OpenAI's error object), 500 (an HTML page over several lines) and 400 (FastAPI's
    ``detail``) for three of six requests: those fail with status and message on one line, the
    other three are measured, the summary counts three failures and the exit status is 1
    (``--max-retries 0``: the 429 is not retried, ``test_retries.py``)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        i = int(body["prompt"][1:])
        if i == 1:
            return web.json_response({"error": {"message": "rate limited", "type": "x"}},
                                     status=429)
        if i == 3:
            return web.Response(status=500, text="<html>\n<b>Internal</b>\n error</html>",
                                content_type="text/html")
        if i == 5:
            return web.json_response({"detail": "bad max_tokens"}, status=400)
        return await stream(request, tokens(3))

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 6)), "--url", server.url,
                       "--max-concurrency", "2", "--max-retries", "0", "--out", str(out)])
        assert server.count == 6
    assert status == 1
    frame, summary, _ = read_result(out)
    errors = dict(zip(frame["index"], frame["error"]))
    assert errors[1] == "HTTP 429: rate limited"
    assert errors[3].startswith("HTTP 500: ") and "\n" not in errors[3]
    assert errors[5] == "HTTP 400: bad max_tokens"
    assert [errors[i] for i in (0, 2, 4)] == ["", "", ""]
    assert summary["errors"] == 3 and summary["completion_tokens"] == 9
    assert (frame[frame["error"] == ""]["ttft_s"] > 0).all()
    printed = capsys.readouterr().out
    assert "3 of 6 requests failed" in printed and "HTTP 429" in printed


def test_a_connection_dropped_mid_stream_fails_that_request(tmp_path: Path) -> None:
    """The server sends two tokens then closes the connection (no finish, no [DONE]), or
    closes it before any answer: those requests fail, naming the cut; the others are
    measured (``--max-retries 0``: the one closed before any answer is not retried,
    ``test_retries.py``)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        cut = {"p0": 2, "p1": 0}.get(body["prompt"])
        return await stream(request, tokens(4), close_after=cut)

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 4)), "--url", server.url,
                     "--max-retries", "0", "--out", str(out)]) == 1
    frame, summary, _ = read_result(out)
    assert frame["error"][0] == "the server closed the connection mid-stream"
    assert "Disconnected" in frame["error"][1] and (frame["error"][2:] == "").all()
    assert summary["errors"] == 2 and frame["completion_tokens"][2:].tolist() == [4, 4]
    assert frame["ttft_s"][2:].notna().all()


def test_a_server_without_a_model_list_is_reachable(tmp_path: Path) -> None:
    """A server with no ``/v1/models`` (404): with ``--model`` the run goes on; without,
    requests go without a model name (was, without: "cannot reach", nothing sent)."""
    async def not_found(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return web.Response(status=404, text="<html>no</html>", content_type="text/html")

    with FakeServer(_ok, models=not_found) as server:
        for model in (["--model", "m"], []):
            assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                         *model, "--out", str(tmp_path / "r.parquet")]) == 0
        assert [b.get("model") for b in server.bodies] == ["m", "m", None, None]


def test_a_server_too_slow_times_out_per_request(tmp_path: Path) -> None:
    """A server that keeps the stream alive (a ``: ping`` every 0.05 s, so the stall timeout
    never fires) but never finishes: ``--request-timeout 0.4`` fails each request as timed out
    (was: no such option; the run hung for as long as the server kept pinging)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        if body["prompt"] == "p1":
            return await stream(request, tokens(2))
        return await stream(request, [b": ping\n\n"] * 1000, gap=0.05)

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)), "--url", server.url,
                       "--request-timeout", "0.4", "--out", str(out)])
    assert status == 1
    frame, summary, _ = read_result(out)
    assert frame["error"][1] == ""
    assert all("timed out" in frame["error"][i] for i in (0, 2))
    assert summary["timeouts"] == 2 and summary["errors"] == 2


@pytest.mark.parametrize("option", [["--max-concurrency", "0"], ["--max-concurrency", "-3"],
                                    ["--time-scale", "0"], ["--time-scale", "-1"],
                                    ["--time-scale", "nan"], ["--time-scale", "inf"],
                                    ["--workers", "0"], ["--num-requests", "0"],
                                    ["--stall-timeout", "0"], ["--stall-timeout", "nan"],
                                    ["--request-timeout", "-1"], ["--request-timeout", "nan"],
                                    ["--max-retries", "-1"]])
def test_bad_settings_are_refused_before_any_request(
        option: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Zero, negative or non-finite concurrency, rate scale, workers, request count or
    timeouts: one line naming the option, exit 2, nothing sent, no file (was: ``--time-scale
    nan`` or ``inf`` accepted, every request sent at once or never)."""
    out = tmp_path / "r.parquet"
    with FakeServer(_ok) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                       *option, "--out", str(out)])
        assert server.count == 0
    err = capsys.readouterr().err
    assert status == 2 and not out.exists()
    assert option[0] in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["", "\n\n", '{"prompt": "a", "max_tokens": }\n'])
def test_an_empty_or_malformed_workload_is_one_line_naming_it(
        text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty workload file or one with a malformed line: one line naming the file, exit 2,
    nothing sent (was, for an empty file: "the workload has no requests", no file named)."""
    path = tmp_path / "w.jsonl"
    path.write_text(text)
    with FakeServer(_ok) as server:
        status = main(["loadgen", str(path), "--url", server.url,
                       "--out", str(tmp_path / "r.parquet")])
        assert server.count == 0
    err = capsys.readouterr().err
    assert status == 2 and "w.jsonl" in err
    assert len(err.strip().splitlines()) == 1


def test_an_out_file_loadgen_did_not_write_is_never_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--out`` naming a file of someone else's: refused before any request, the file as it
    was; an earlier loadgen result is replaced (``tracing.outfile``'s rule)."""
    out = tmp_path / "notes.parquet"
    out.write_text("mine")
    with FakeServer(_ok) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                     "--out", str(out)]) == 2
        assert server.count == 0 and out.read_text() == "mine"
        assert "not an earlier loadgen result" in capsys.readouterr().err
        result = tmp_path / "r.parquet"
        for _ in range(2):
            assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                         "--out", str(result)]) == 0
    assert len(read_result(result)[0]) == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_base_url_ending_in_v1_is_the_same_server(tmp_path: Path) -> None:
    """``--url http://host:port/v1`` (how the OpenAI client is given a base URL) reaches the
    same endpoints (was: /v1/v1/completions, every request a 404)."""
    with FakeServer(_ok) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)),
                     "--url", server.url + "/v1/", "--out", str(tmp_path / "r.parquet")]) == 0

