"""A recipe prompt (``prompt_len`` with ``hash_ids``, as ``workload generate`` and every importer
write) goes to the server as its token ids."""

from __future__ import annotations

import json
from pathlib import Path

from _fake_server import FakeServer, stream, tokens
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.result import read_result
from replay.workloads.recipe import PromptRecipe


def test_a_recipe_prompt_is_sent_as_its_token_ids(tmp_path: Path) -> None:
    """Was: ``TypeError: Object of type PromptRecipe is not JSON serializable``, a traceback
    before the first request, for any generated or imported workload (the README's
    ``workload generate`` then ``loadgen``)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return await stream(request, tokens(2))

    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"prompt_len": 20 + i, "hash_ids": [7], "salt": i,
                                        "hash_block_size": 16, "max_tokens": 2}) + "\n"
                            for i in range(2)))
    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        assert main(["loadgen", str(path), "--url", server.url, "--out", str(out)]) == 0
        sent = sorted((b["prompt"] for b in server.bodies), key=len)
    assert sent == [PromptRecipe((7,), 16, 20 + i, i).token_ids() for i in range(2)]
    frame, _, _ = read_result(out)
    assert (frame["error"] == "").all() and frame["max_tokens"].tolist() == [2, 2]
