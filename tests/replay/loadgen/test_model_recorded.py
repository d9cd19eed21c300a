"""The result's ``run.model`` is the model the server answered with, not ``--model`` as typed:
without ``--model`` it was ``null`` although the server named the model it served in every
chunk (and loadgen had sent the name its ``/v1/models`` lists). And a ``--tokenizer`` that
cannot load is named as that option, not as a "model directory"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _fake_server import FakeServer, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.result import read_result


def _answering_as(name: str):  # noqa: ANN202 - a fake server's handler
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        lines = [line.replace(b'"model": "m"', f'"model": {json.dumps(name)}'.encode())
                 for line in tokens(2)]
        return await stream(request, lines)
    return answer


def test_the_result_records_the_model_the_server_answered_with(tmp_path: Path) -> None:
    """No ``--model``: the server lists "m", loadgen sends "m", the answers name
    "m-2024-08-06" (as OpenAI answers an alias): the result says "m-2024-08-06". With
    ``--model m`` the same: what answered, not what was asked."""
    for extra, out in (([], "a.parquet"), (["--model", "m"], "b.parquet")):
        with FakeServer(_answering_as("m-2024-08-06")) as server:
            assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url",
                         server.url, "--out", str(tmp_path / out), *extra]) == 0
            assert [b["model"] for b in server.bodies] == ["m", "m"]
        _, _, run = read_result(tmp_path / out)
        assert run["model"] == "m-2024-08-06"


def test_without_an_answer_the_model_sent_is_recorded(tmp_path: Path) -> None:
    """Every request refused (HTTP 400, no chunk): the result names the model loadgen sent,
    the one ``/v1/models`` listed ("m"), not null."""
    async def refuse(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return web.json_response({"error": {"message": "no"}}, status=400)

    with FakeServer(refuse) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                     "--out", str(tmp_path / "r.parquet")]) == 1
    _, _, run = read_result(tmp_path / "r.parquet")
    assert run["model"] == "m"


def test_a_tokenizer_that_cannot_load_names_the_option(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A conversation workload with ``--tokenizer`` naming no checkpoint: one line naming
    ``--tokenizer`` and the path, exit 2, nothing sent (it said "model directory ... does not
    exist", an option the command does not have)."""
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"prompt_len": 3, "salt": t, "max_tokens": 2,
                                        "conversation_id": "c", "turn": t}) + "\n"
                            for t in range(2)))
    with FakeServer(_answering_as("m")) as server:
        status = main(["loadgen", str(path), "--url", server.url, "--tokenizer",
                       str(tmp_path / "none"), "--out", str(tmp_path / "r.parquet")])
        assert server.count == 0
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert f"--tokenizer {tmp_path / 'none'}:" in err
