"""``loadgen --model NAME`` naming a model the server does not serve: one line naming the
models it lists, exit 2, nothing sent and no result (every request was sent, each a 404, a
result of failures written, exit 1). A name the server lists, or a server whose
``/v1/models`` lists nothing, still runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fake_server import FakeServer, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main


async def _ok(request: web.Request, body: dict, n: int) -> web.StreamResponse:
    return await stream(request, tokens(3))


def test_a_model_the_server_does_not_list_is_one_line_before_anything_is_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fake server lists "m"; ``--model nope``: exit 2, one line naming both, no request
    sent, no result file."""
    out = tmp_path / "r.parquet"
    with FakeServer(_ok) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)), "--url", server.url,
                       "--model", "nope", "--out", str(out)])
        assert server.count == 0
    err = capsys.readouterr().err
    assert status == 2 and not out.exists()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "'nope'" in err and "'m'" in err and "--model" in err


def test_a_listed_model_or_a_server_listing_none_runs(tmp_path: Path) -> None:
    """``--model m`` against a server listing "m", and ``--model x`` against one whose list is
    empty (nothing to check it against): both run, the name sent as given."""
    async def empty(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": []})

    with FakeServer(_ok) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                     "--model", "m", "--out", str(tmp_path / "a.parquet")]) == 0
        assert [b["model"] for b in server.bodies] == ["m", "m"]
    with FakeServer(_ok, models=empty) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                     "--model", "x", "--out", str(tmp_path / "b.parquet")]) == 0
        assert [b["model"] for b in server.bodies] == ["x", "x"]
