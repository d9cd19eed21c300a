"""``loadgen --num-requests N`` (and ``run``/``whatif --num-seqs N``, which read a
workload through the same ``replay.cli.run.load_requests``) read only the first N requests of
the file, and ``--workers`` is bounded (docs/TESTING.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _fake_server import FakeServer, stream, tokens, workload
from aiohttp import web

from engine.errors import InvalidRequestError
from replay.cli.main import main
from replay.cli.run import load_requests
from replay.loadgen.result import read_result
from replay.loadgen.settings import max_workers


async def _answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
    return await stream(request, tokens(2))


def _good_then_bad(path: Path, good: int) -> Path:
    """``good`` valid requests, then a line that is not JSON, then more valid ones."""
    workload(path, good)
    with path.open("a") as handle:
        handle.write("{this is not json\n")
        handle.write(json.dumps({"prompt": "late", "max_tokens": 4}) + "\n")
    return path


def test_loadgen_num_requests_reads_only_the_first_n(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A workload whose 4th line is broken, ``--num-requests 2``: the two first requests are
    sent, exit 0. Before: the whole file was read and checked first, so the bad line far past
    N failed the run (exit 2, nothing sent), and a 10-million-line file was read whole before
    the first of 100 requests went out."""
    path = _good_then_bad(tmp_path / "w.jsonl", 3)
    with FakeServer(_answer) as server:
        assert main(["loadgen", str(path), "--url", server.url, "--num-requests", "2",
                     "--out", str(tmp_path / "r.parquet")]) == 0
        assert server.count == 2
    frame, _, settings = read_result(tmp_path / "r.parquet")
    assert len(frame) == 2 and settings["requests_planned"] == 2


def test_a_bad_line_within_n_still_fails_before_sending(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The requests that are read are still checked: the broken line 4 with ``--num-requests
    4`` (or none) is one line, exit 2, nothing sent."""
    path = _good_then_bad(tmp_path / "w.jsonl", 3)
    with FakeServer(_answer) as server:
        for extra in (["--num-requests", "4"], []):
            assert main(["loadgen", str(path), "--url", server.url, *extra,
                         "--out", str(tmp_path / "r.parquet")]) == 2
        assert server.count == 0
    err = capsys.readouterr().err
    assert err.count(f"{path}:4") == 2 and "Traceback" not in err


def test_load_requests_stops_after_n(tmp_path: Path) -> None:
    """``run --num-seqs`` and ``whatif --num-seqs`` share the rule: the first N requests, the
    lines past them never parsed. Before: ``InvalidRequestError`` for line 4 with N = 3."""
    path = _good_then_bad(tmp_path / "w.jsonl", 3)
    assert [r.prompt for r in load_requests(str(path), 3)] == ["p0", "p1", "p2"]
    with pytest.raises(InvalidRequestError, match=r"w\.jsonl:4"):
        load_requests(str(path), None)
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(InvalidRequestError, match="holds no requests"):
        load_requests(str(empty), 5)


def test_loadgen_workers_are_bounded(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``--workers 100000`` (a typo) started one Python process per session, up to that
    many: memory ran out. Now one line, exit 2, before anything is read or sent."""
    path = workload(tmp_path / "w.jsonl", 2)
    too_many = max_workers() + 1
    assert main(["loadgen", str(path), "--url", "http://127.0.0.1:9", "--workers",
                 str(too_many), "--out", str(tmp_path / "r.parquet")]) == 2
    err = capsys.readouterr().err
    assert f"--workers must be at most {max_workers()}" in err
    assert len(err.strip().splitlines()) == 1
