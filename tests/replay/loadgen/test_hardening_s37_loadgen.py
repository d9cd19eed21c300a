"""Session 37's loadgen cases: a server that answers under another model name than the one
asked for, and what a captured stderr holds (docs/TESTING.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _fake_server import FakeServer, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.result import read_result


def _answering(names: list[str]):  # noqa: ANN202 - a fake server's handler
    """Answer request n under the model name ``names[n % len(names)]``."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        name = json.dumps(names[n % len(names)]).encode()
        return await stream(request, [line.replace(b'"model": "m"', b'"model": ' + name)
                                      for line in tokens(2)])
    return answer


def test_an_answer_from_another_model_than_asked_is_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--model m``, the server answers every request as "other" (a proxy's fallback, a
    router's default): the run says so in a note naming both and how many requests, and the
    result records "other". Before: exit 0 and not a word; the table read as m's."""
    with FakeServer(_answering(["other"])) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)), "--url", server.url,
                     "--model", "m", "--out", str(tmp_path / "r.parquet")]) == 0
    out = capsys.readouterr().out
    assert ("note: asked for --model 'm', the server answered as 'other' (3 of 3 requests); "
            "the result records 'other'") in out
    assert read_result(tmp_path / "r.parquet")[2]["model"] == "other"


def test_answers_under_several_model_names_are_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No ``--model``; the server answers under two names (a load balancer over two
    deployments): a note names each with its count, the result the most common. Before: the
    most common recorded in silence, the other lost. One name only: no note."""
    with FakeServer(_answering(["a", "a", "b"])) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)), "--url", server.url,
                     "--max-concurrency", "1", "--out", str(tmp_path / "r.parquet")]) == 0
    out = capsys.readouterr().out
    assert ("note: the server answered under 2 model names: 'a' (2 of 3 requests), 'b' (1); "
            "the result records 'a'") in out
    with FakeServer(_answering(["m"])) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)), "--url", server.url,
                     "--model", "m", "--out", str(tmp_path / "s.parquet")]) == 0
    assert "answered" not in capsys.readouterr().out


def test_no_progress_bar_on_a_captured_stderr(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """stderr not a terminal (a log, a CI job): it holds none of the progress bar's redraws,
    as ``workload import`` and ``whatif`` keep theirs off it. Before: each redraw
    ("loadgen:  33%|...") went into the log."""
    with FakeServer(_answering(["m"])) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 3)), "--url", server.url,
                     "--out", str(tmp_path / "r.parquet")]) == 0
    assert "loadgen:" not in capsys.readouterr().err


@pytest.mark.parametrize("name", ["r.csv", "r.jsonl", "r.json", "r.csv.gz"])
def test_an_out_named_as_another_format_is_refused_before_sending(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """``--out r.csv`` (or .json, .jsonl): the result is Parquet whatever its name, so a file
    named so would hold Parquet bytes a CSV reader cannot open. Refused in one line before
    anything is sent, nothing written. Before: the run went on and wrote Parquet as
    ``r.csv``."""
    with FakeServer(_answering(["m"])) as server:
        assert main(["loadgen", str(workload(tmp_path / "w.jsonl", 2)), "--url", server.url,
                     "--out", str(tmp_path / name)]) == 2
        assert server.count == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"replayllm loadgen: error: --out {tmp_path / name}: a loadgen result is a "
                   "Parquet file; name it .parquet (read it with pandas.read_parquet or "
                   "whatif --compare)"]
    assert not (tmp_path / name).exists()
