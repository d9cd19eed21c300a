"""What loadgen measures (TTFT, TPOT, ITL, e2e, token counts) of the stream shapes real servers
send around their tokens: a chunk per generated token whose text is held back (``text: ""`` /
``content: ""``: vLLM and replayllm serve send one for a token that ends mid-character
or decodes to nothing), a role-only first chat chunk, a finish reason alone in its chunk, an
answer with no text at all, a whole answer in one chunk, a usage of zeros in every chunk. Each
stream is ``_fake_server.FakeServer``'s on loopback, with its own timing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _fake_server import FakeServer, chunk, stream
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.result import read_result

GAP = 0.15  # seconds between the fake server's chunks


def _delta(finish: str | None = None, **fields: object) -> bytes:
    return b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": fields, "finish_reason": finish}]}).encode() + b"\n\n"


def _run(tmp_path: Path, completions: list[bytes], chat: list[bytes],
         capsys: pytest.CaptureFixture[str]) -> tuple:
    """Request 0 (``/v1/completions``) gets ``completions``, request 1 (a one-turn
    conversation, ``/v1/chat/completions``) gets ``chat``, each a chunk every ``GAP`` s, the
    first after ``GAP``; returns (exit status, frame, printed output)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return await stream(request, chat if "messages" in body else completions,
                            first_delay=GAP, gap=GAP)

    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"prompt": "p", "max_tokens": 8, "arrival_s": 0.0}) + "\n"
                    + json.dumps({"prompt": "q", "max_tokens": 8, "arrival_s": 0.0,
                                  "conversation_id": "c", "turn": 0}) + "\n")
    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(path), "--url", server.url, "--out", str(out)])
    frame, _, _ = read_result(out)
    return status, frame.sort_values("index").reset_index(drop=True), capsys.readouterr().out


def _near(value: float, expected: float) -> bool:
    """Within the loopback's jitter of ``expected`` (well under one ``GAP``)."""
    return expected - 0.02 <= value < expected + 0.5 * GAP


def test_a_token_whose_text_is_held_back_is_its_first_token_and_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A completions chunk ``text: ""`` and a chat chunk ``content: ""`` (no role, no finish
    reason) each carry a generated token whose text the server holds back: TTFT is that chunk
    (at ``GAP``), it is counted without usage and opens the ITL gaps; the chat stream's
    role-only first chunk (``content: ""`` with ``role``) and a finish reason alone in an
    empty chunk are not tokens (was: TTFT at the first non-empty text, one token and one gap
    short)."""
    completions = [chunk(""), chunk(" a"), chunk(" b"), chunk(finish="length"),
                   b"data: [DONE]\n\n"]
    chat = [_delta(role="assistant", content=""), _delta(content=""), _delta(content="a"),
            _delta(content="b"), _delta(finish="length"), b"data: [DONE]\n\n"]
    status, frame, _ = _run(tmp_path, completions, chat, capsys)
    assert status == 0
    assert _near(frame["ttft_s"][0], GAP), frame["ttft_s"][0]
    assert _near(frame["ttft_s"][1], 2 * GAP), frame["ttft_s"][1]
    assert frame["completion_tokens"].tolist() == [3, 3]
    assert frame["token_source"].tolist() == ["chunks", "chunks"]
    assert [len(gaps) for gaps in frame["itl_s"]] == [2, 2]
    assert all(_near(gap, GAP) for gaps in frame["itl_s"] for gap in gaps)


def test_an_answer_without_text_has_its_e2e_and_says_it_has_no_ttft(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An answer that ends at once (its finish reason in an empty chunk, usage of one token:
    an end of sequence first) is complete, not failed: its e2e is when its finish reason came
    and the makespan covers it; no output came, so no TTFT, and the run says so in one line
    (was: e2e NaN too, the request left out of every latency and of the makespan without a
    word). A finish reason alone after the tokens ends the e2e of the other."""
    completions = [chunk(finish="stop"),
                   chunk(usage={"prompt_tokens": 1, "completion_tokens": 1}, choices=False),
                   b"data: [DONE]\n\n"]
    chat = [_delta(role="assistant", content=""), _delta(content="a"), _delta(content="b"),
            _delta(finish="stop"), b"data: [DONE]\n\n"]
    status, frame, printed = _run(tmp_path, completions, chat, capsys)
    assert status == 0 and (frame["error"] == "").all()
    assert math.isnan(frame["ttft_s"][0])
    assert _near(frame["e2e_s"][0], GAP), frame["e2e_s"][0]
    assert _near(frame["e2e_s"][1], 4 * GAP), frame["e2e_s"][1]
    assert "1 request sent no output (no TTFT)" in printed


def test_a_whole_answer_in_one_chunk_has_no_tpot(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A server that sends all its tokens in one chunk (usage: 5; in the chat stream, with its
    finish reason and usage in that chunk): the time between tokens
    cannot be seen, so TPOT is NaN and the run says so (was: TPOT 0.0 s, averaged into the
    summary as if the server had generated the other four tokens in no time)."""
    completions = [chunk(" a b c d e"), chunk(finish="length"),
                   chunk(usage={"prompt_tokens": 1, "completion_tokens": 5}, choices=False),
                   b"data: [DONE]\n\n"]
    chat = [b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "a b c d e"},
                                                 "finish_reason": "length"}],
                                    "usage": {"completion_tokens": 5}}).encode() + b"\n\n",
            b"data: [DONE]\n\n"]
    status, frame, printed = _run(tmp_path, completions, chat, capsys)
    assert status == 0
    assert frame["completion_tokens"].tolist() == [5, 5]
    assert frame["tpot_s"].isna().all()
    assert frame["itl_s"].map(len).tolist() == [0, 0]
    assert "2 requests sent their output in one chunk (no TPOT)" in printed


def test_a_usage_below_the_output_seen_is_not_taken(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A proxy that puts an empty usage (all zeros, as LiteLLM's ``Usage()``) in every chunk
    and no final count: the three output chunks are counted, said to be (``token_source``
    "chunks" and the run's note), and TPOT is measured (was: 0 completion tokens taken as the
    server's count, so no TPOT and a throughput of 0, without a word). A usage in every chunk
    that counts the tokens so far (vLLM's ``continuous_usage_stats``) is still the count."""
    zeros = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    completions = [chunk(" a", usage=zeros), chunk(" b", usage=zeros), chunk(" c", usage=zeros),
                   chunk(finish="length", usage=zeros), b"data: [DONE]\n\n"]
    chat = [b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "a b"},
                                                 "finish_reason": None}],
                                    "usage": {"completion_tokens": k * 2}}).encode() + b"\n\n"
            for k in (1, 2)] + [_delta(finish="length"), b"data: [DONE]\n\n"]
    status, frame, printed = _run(tmp_path, completions, chat, capsys)
    assert status == 0
    assert frame["completion_tokens"].tolist() == [3, 4]
    assert frame["token_source"].tolist() == ["chunks", "usage"]
    assert frame["tpot_s"].notna().all()
    assert "output chunks counted" in printed
