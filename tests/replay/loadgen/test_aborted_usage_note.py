"""A run against a server that stopped mid-run (``replayllm serve`` past its grace period ends
each open stream with ``finish_reason`` ``abort``, then its usage and ``[DONE]``): loadgen stops
reading a failed stream at its failure, so a failed request's tokens are its chunks counted.
Those requests are not in the summary's tokens; the run's ``completion_tokens_from`` and its
"no usage counts" note are about the answered ones only. Before, every such run said the
server sent no usage counts, and recorded "usage+chunks", of a server that always sends them."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fake_server import FakeServer, chunk, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.result import read_result


def test_aborted_streams_do_not_make_the_run_say_usage_was_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Request 1 of 3 is aborted after two tokens (usage and ``[DONE]`` follow, as the server
    sends them): it fails, the others are answered with usage; the run's tokens come from
    "usage" and no note says otherwise. A server that really sends no usage still gets it."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        if body["prompt"] == "p1":
            return await stream(request, [chunk(" a"), chunk(" b"), chunk(finish="abort"),
                                          chunk(usage={"prompt_tokens": 2,
                                                       "completion_tokens": 2},
                                                choices=False), b"data: [DONE]\n\n"])
        return await stream(request, tokens(3))

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)), "--url", server.url,
                       "--out", str(out)])
    assert status == 1
    frame, summary, run = read_result(out)
    assert "abort" in frame["error"][1] and summary["completion_tokens"] == 6
    assert run["completion_tokens_from"] == "usage"
    assert "no usage counts" not in capsys.readouterr().out

    async def no_usage(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return await stream(request, tokens(3, usage=False))

    with FakeServer(no_usage) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                     "--out", str(out)]) == 0
    assert read_result(out)[2]["completion_tokens_from"] == "chunks"
    assert "no usage counts" in capsys.readouterr().out
