"""``--engine thread`` (the engine in a thread of the HTTP server) still serves: the same greedy
answers as the default engine process, and a trace that verifies."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from server_process import ServerProcess  # noqa: E402

from replay.verify import verify  # noqa: E402

PROMPTS = ["the engine", "a thread or a process", "x"]


def _answers(url: str) -> list[str]:
    out = []
    for prompt in PROMPTS:
        response = httpx.post(url + "/v1/completions", timeout=60, json={
            "prompt": prompt, "max_tokens": 6, "temperature": 0.0, "ignore_eos": True})
        assert response.status_code == 200, response.text
        out.append(response.json()["choices"][0]["text"])
    return out


def test_thread_and_process_engines_answer_alike(tmp_path: Path) -> None:
    answers = {}
    for mode in ("thread", "process"):
        server = ServerProcess(tmp_path / mode, "--engine", mode)
        try:
            assert f"engine in a {mode}" in server.output()
            answers[mode] = _answers(server.url)
            assert server.terminate() in (0, -15)
        finally:
            server.kill()
        assert verify(tmp_path / mode).identical
    assert answers["thread"] == answers["process"]
