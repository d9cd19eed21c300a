"""A server's error answer, non-stream JSON answer or ``/v1/models`` list is read
only up to a bound, never whole: a broken server (or a proxy's endless page) could send
gigabytes, and loadgen read them all into memory. Each fake server here streams a body far over
the bound, counting what it managed to send before the client hung up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _fake_server import FakeServer, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.client import MAX_BODY_BYTES
from replay.loadgen.result import read_result
from replay.loadgen.settings import MAX_MODELS_BYTES

PIECE = 1 << 16
# Far over either bound (and over what the kernel's socket buffers hold on loopback, a few MB),
# small enough that a client reading it whole (before) finished in seconds.
HUGE = 160 << 20


class Huge:
    """A handler streaming ``start`` and then spaces up to ``HUGE`` bytes; ``sent`` counts the
    bytes written before the client closed the connection."""

    def __init__(self, status: int, content_type: str, start: bytes) -> None:
        self.status, self.content_type, self.start = status, content_type, start
        self.sent = 0

    async def __call__(self, request: web.Request, body: dict, n: int) -> web.StreamResponse:
        response = web.StreamResponse(status=self.status,
                                      headers={"Content-Type": self.content_type})
        await response.prepare(request)
        try:
            await response.write(self.start)
            self.sent = len(self.start)
            while self.sent < HUGE:
                await response.write(b" " * PIECE)
                self.sent += PIECE
            await response.write_eof()
        except (ConnectionError, RuntimeError):  # the client hung up: what we wanted
            pass
        return response


def _loadgen(server: FakeServer, tmp_path: Path, *extra: str) -> int:
    return main(["loadgen", str(workload(tmp_path / "w.jsonl", 1)), "--url", server.url,
                 "--max-retries", "0", "--out", str(tmp_path / "r.parquet"), *extra])


@pytest.mark.parametrize("status,content_type", [(500, "text/html"),
                                                 (400, "application/json"),
                                                 (200, "application/json")])
def test_a_huge_error_body_is_cut_and_said_so(status: int, content_type: str,
                                              tmp_path: Path) -> None:
    """An error status with an endless HTML or JSON body, or a 200 JSON (not a stream) one:
    the request fails with one line quoting the start and saying the body was cut at the
    bound, and the client stops reading there (the server could send far less than the whole
    body). Before: the whole body (160 MiB here) was read into memory, no word of a cut."""
    start = b'{"error": {"message": "boom' if "json" in content_type else b"<html>boom"
    huge = Huge(status, content_type, start)
    with FakeServer(huge) as server:
        assert _loadgen(server, tmp_path) == 1
    frame, _, _ = read_result(tmp_path / "r.parquet")
    error = frame["error"][0]
    assert f"cut at {MAX_BODY_BYTES // 1024} KiB" in error and "\n" not in error, error
    assert (f"HTTP {status}: " in error) == (status != 200), error
    assert huge.sent < HUGE // 4, huge.sent


def test_a_short_error_body_is_not_said_to_be_cut(tmp_path: Path) -> None:
    """An ordinary error answer (under the bound) reads as before: its message, no note."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return web.json_response({"error": {"message": "bad"}}, status=400)

    with FakeServer(answer) as server:
        assert _loadgen(server, tmp_path) == 1
    frame, _, _ = read_result(tmp_path / "r.parquet")
    assert frame["error"][0] == "HTTP 400: bad"


def _models_start() -> bytes:
    return json.dumps({"object": "list", "data": [{"id": "m"}]})[:-1].encode()


async def _ok(request: web.Request, body: dict, n: int) -> web.StreamResponse:
    return await stream(request, tokens(2))


def test_a_huge_model_list_without_model_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``/v1/models`` answering an endless list and no ``--model``: one line saying the list
    was cut at its bound and asking for ``--model``, exit 2, nothing sent, and the client
    stopped reading near the bound. Before: the whole body was read into memory, did not parse,
    and the run went on with no model name."""
    huge = Huge(200, "application/json", _models_start())
    with FakeServer(_ok, models=huge) as server:
        assert _loadgen(server, tmp_path) == 2
        assert server.count == 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--model" in err, err
    assert f"cut at {MAX_MODELS_BYTES >> 20} MiB" in err, err
    assert huge.sent < MAX_MODELS_BYTES + HUGE // 4, huge.sent
    assert not (tmp_path / "r.parquet").exists()


def test_a_huge_model_list_with_model_goes_on_unchecked(tmp_path: Path) -> None:
    """With ``--model`` the name cannot be checked against a cut list: the run goes on with it
    (each request would say if the server does not know it), reading only the bound."""
    huge = Huge(200, "application/json", _models_start())
    with FakeServer(_ok, models=huge) as server:
        assert _loadgen(server, tmp_path, "--model", "m") == 0
        assert [b.get("model") for b in server.bodies] == ["m"]
    assert huge.sent < MAX_MODELS_BYTES + HUGE // 4, huge.sent
