"""What loadgen makes of the event streams real servers send: SSE variants, malformed or odd
chunks, usage late or absent, finish reasons, a JSON answer where a stream was asked for. One
request per server answer; each stream is ``_fake_server.FakeServer``'s on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _fake_server import FakeServer, chunk, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.result import read_result


def _run(tmp_path: Path, lines_of: list[list[bytes]], **stream_kw: object) -> tuple:
    """Request i gets ``lines_of[i]``; returns (exit status, frame, summary, run)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return await stream(request, lines_of[int(body["prompt"][1:])], **stream_kw)

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", len(lines_of))),
                       "--url", server.url, "--max-concurrency", "4", "--out", str(out)])
    return (status, *read_result(out))


def test_sse_spellings_comments_and_line_endings(tmp_path: Path) -> None:
    """``data:`` without its space (the SSE spec makes it optional), CRLF line ends, ``: ping``
    comments and an ``event:`` line between chunks: all three tokens read (was: a line without
    the space skipped, the request failed for want of a finish reason)."""
    plain = tokens(3)
    no_space = [line.replace(b"data: ", b"data:", 1) for line in plain]
    crlf = [line.replace(b"\n", b"\r\n") for line in plain]
    pings = [b": ping\n\n", plain[0], b": ping\n\nevent: message\n", *plain[1:]]
    status, frame, _, _ = _run(tmp_path, [no_space, crlf, pings])
    assert status == 0 and (frame["error"] == "").all()
    assert frame["completion_tokens"].tolist() == [3, 3, 3]
    assert all(len(itl) == 2 for itl in frame["itl_s"])


@pytest.mark.parametrize("bad", [b"data: {not json\n\n", b"data: 42\n\n", b"data: null\n\n",
                                 b'data: {"choices": [null, 3]}\n\n',
                                 b'data: {"choices": {"text": "x"}}\n\n',
                                 b'data: {"choices": [{"text": 5}]}\n\n',
                                 b'data: {"usage": {"completion_tokens": "many"}}\n\n',
                                 b'data: {"choices": [], "usage": "many"}\n\n',
                                 b'data: {"error": "overloaded"}\n\n'])
def test_a_malformed_chunk_fails_its_request_only(bad: bytes, tmp_path: Path) -> None:
    """A ``data:`` line that is not JSON, not an object, or whose ``choices`` / ``usage`` /
    ``error`` are of the wrong shape: that request fails with a message quoting the line, the
    other is measured (was: an AttributeError or TypeError out of the run, a traceback and
    no result)."""
    good = tokens(2)
    status, frame, summary, _ = _run(tmp_path, [[good[0], bad, *good[1:]], good])
    assert status == 1 and summary["errors"] == 1
    assert frame["error"][0] != "" and frame["error"][1] == ""
    assert ("overloaded" in frame["error"][0]
            or bad[6:].strip()[:14].decode() in frame["error"][0])


def test_done_or_finish_ends_a_stream(tmp_path: Path) -> None:
    """A stream with its finish reason but no ``[DONE]`` is complete; one with ``[DONE]`` and no
    finish reason (servers that send ``finish_reason: null`` throughout) is complete too (was:
    failed); one with neither, cut after its tokens, fails."""
    full = tokens(3)
    no_done = full[:-1]
    no_finish = [chunk(" a"), chunk(" b"), full[-1]]
    neither = full[:3]
    status, frame, _, _ = _run(tmp_path, [no_done, no_finish, neither])
    assert status == 1
    assert frame["error"].tolist()[:2] == ["", ""] and "[DONE]" in frame["error"][2]
    assert frame["completion_tokens"].tolist()[:2] == [3, 2]


def test_token_counts_come_from_usage_or_chunks_and_say_which(tmp_path: Path) -> None:
    """Usage only in the last chunk (after an empty-``choices`` chunk): its count is taken (4,
    though the server sent 2 chunks of 2 tokens); no usage: content chunks are counted; the
    result says which per request (``token_source``) and for the run (was: not recorded)."""
    with_usage = [chunk(" a b"), chunk(" c d"), chunk(finish="stop"),
                  chunk(usage={"prompt_tokens": 2, "completion_tokens": 4}, choices=False),
                  b"data: [DONE]\n\n"]
    without = tokens(3, usage=False)
    empty_choices = [chunk(choices=False), *tokens(2)]
    status, frame, _, run = _run(tmp_path, [with_usage, without, empty_choices])
    assert status == 0
    assert frame["completion_tokens"].tolist() == [4, 3, 2]
    assert frame["token_source"].tolist() == ["usage", "chunks", "usage"]
    assert run["completion_tokens_from"] == "usage+chunks"
    assert frame["tpot_s"].notna().all()


def test_finish_reasons_are_kept(tmp_path: Path) -> None:
    """``length``, ``stop`` and ``content_filter`` end a request without error, each kept."""
    reasons = ["length", "stop", "content_filter"]
    status, frame, _, _ = _run(tmp_path, [tokens(2, finish=r) for r in reasons])
    assert status == 0 and frame["finish_reason"].tolist() == reasons


def test_a_json_answer_to_a_stream_request_is_a_clear_failure(tmp_path: Path) -> None:
    """A server that ignores ``stream: true`` and answers one JSON completion: the request
    fails saying so (was: "the stream ended without a finish reason"); one that answers a JSON
    error object with status 200 fails with its message."""
    answer = json.dumps({"choices": [{"text": "hi", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
    error = json.dumps({"error": {"message": "model overloaded"}}).encode()

    async def reply(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return web.Response(body=answer if body["prompt"] == "p0" else error,
                            content_type="application/json")

    out = tmp_path / "r.parquet"
    with FakeServer(reply) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                     "--out", str(out)]) == 1
    frame, _, _ = read_result(out)
    assert "not an event stream" in frame["error"][0]
    assert frame["error"][1] == "model overloaded"


def test_a_reasoning_models_thinking_is_its_first_token(tmp_path: Path) -> None:
    """A chat stream whose first deltas are ``reasoning_content`` (vLLM's reasoning parsers),
    then ``content``: TTFT is the first thought, every delta a token, and the next turn's
    history holds only the answer (was: TTFT at the first answer token, thoughts uncounted)."""
    def delta(**fields: str) -> bytes:
        return b"data: " + json.dumps({"choices": [{"index": 0, "delta": fields,
                                                    "finish_reason": None}]}).encode() + b"\n\n"

    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        lines = [delta(reasoning_content="hmm"), delta(reasoning_content=" so"),
                 delta(content="yes"), b'data: {"choices": [{"delta": {}, '
                 b'"finish_reason": "stop"}]}\n\n', b"data: [DONE]\n\n"]
        return await stream(request, lines, first_delay=0.05 if n == 0 else 0, gap=0.1)

    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"turn {t}", "max_tokens": 3,
                                        "conversation_id": "c", "turn": t,
                                        **({"arrival_s": 0.0} if t == 0 else
                                           {"think_time_s": 0.0})}) + "\n" for t in range(2)))
    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        assert main(["loadgen", str(path), "--url", server.url, "--out", str(out)]) == 0
        history = server.bodies[1]["messages"]
    frame, _, _ = read_result(out)
    assert frame["completion_tokens"].tolist() == [3, 3]
    assert frame["ttft_s"][0] < 0.1 and len(frame["itl_s"][0]) == 2
    assert history[1] == {"role": "assistant", "content": "yes"}


def test_an_answer_the_server_gave_up_on_is_a_failure(tmp_path: Path) -> None:
    """``finish_reason`` ``abort`` or ``error`` (vLLM's and SGLang's for a request they dropped)
    fails its request, however many tokens came first; the others stand (exit 1)."""
    status, frame, summary, _ = _run(tmp_path, [tokens(2, finish="abort"),
                                                tokens(2, finish="error"), tokens(2)])
    assert status == 1
    errors = frame["error"].tolist()
    assert "finish_reason 'abort'" in errors[0] and "finish_reason 'error'" in errors[1]
    assert errors[2] == ""


def test_an_api_key_is_sent_as_a_bearer_token_and_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server started with an API key (vLLM's --api-key) gets ``Authorization: Bearer KEY``
    on every request, from --api-key or $OPENAI_API_KEY; without it, the refused /v1/models is
    one line naming the option (exit 2, no result); the key is in no file written."""
    seen: list[str | None] = []

    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization"))
        return await stream(request, tokens(2))

    async def models(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        if request.headers.get("Authorization") != "Bearer s3cret":
            return web.json_response({"error": {"message": "unauthorized"}}, status=401)
        return web.json_response({"data": [{"id": "m"}]})

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "r.parquet"
    wl = str(workload(tmp_path / "w.jsonl", 2))
    with FakeServer(answer, models) as server:
        assert main(["loadgen", wl, "--url", server.url, "--out", str(out)]) == 2
        assert not out.exists()
        assert main(["loadgen", wl, "--url", server.url, "--out", str(out),
                     "--api-key", "s3cret"]) == 0
        monkeypatch.setenv("OPENAI_API_KEY", "s3cret")
        assert main(["loadgen", wl, "--url", server.url, "--out", str(out)]) == 0
    assert seen == ["Bearer s3cret"] * 4
    assert b"s3cret" not in out.read_bytes()
