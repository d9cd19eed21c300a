"""A workload's request priorities go to the server (vLLM's ``priority`` extension, which
``replayllm serve`` takes and records), completions and a conversation's chat turns alike."""

from __future__ import annotations

import json
from pathlib import Path

from _fake_server import FakeServer, stream, tokens
from aiohttp import web

from replay.cli.main import main


def test_each_request_is_sent_with_its_priority(tmp_path: Path) -> None:
    """``loadgen`` sent no ``priority``: a workload of priorities ran on the server at 0
    each, its trace recording none of them, in silence. A request of priority 0 (the
    default) is sent as before, without the field, for servers that do not know it."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return await stream(request, tokens(2))

    rows = [{"prompt_token_ids": [5, 6, 7 + i], "max_tokens": 2, "priority": p,
             "arrival_s": i * 0.01} for i, p in enumerate([4, -3, 0])]
    rows.append({"prompt": "a turn", "max_tokens": 2, "priority": 9, "conversation_id": "c",
                 "arrival_s": 0.03})
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        assert main(["loadgen", str(path), "--url", server.url, "--out", str(out)]) == 0
        bodies = list(server.bodies)
    sent = {b["prompt"][-1]: b.get("priority", "absent") for b in bodies if "prompt" in b}
    assert sent == {7: 4, 8: -3, 9: "absent"}
    (chat,) = [b for b in bodies if "messages" in b]
    assert chat["priority"] == 9
