"""Server-sent events as the WHATWG spec decodes them (``replay.loadgen.sse``): an event's
``data:`` lines joined with "\\n", CRLF / LF / CR line ends however the network splits them,
comments and other fields, an event the stream ends without its blank line; then the same
through ``replayllm loadgen`` against ``_fake_server.FakeServer`` on loopback."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from _fake_server import FakeServer, chunk, stream, tokens, workload
from aiohttp import web

from replay.cli.main import main
from replay.loadgen.result import read_result
from replay.loadgen.sse import MAX_LINE_BYTES, Event, EventStreamDecoder

# Every rule of the spec the client meets: a comment, an event type, an id and a retry
# field, data with and without its space, one space taken (not two), an empty data line, an
# event of no data (not dispatched), a field without a colon, an unknown field.
STREAM = (b": hello\n"
          b"event: first\nid: 7\nretry: 100\ndata: a\ndata:b\ndata:  c\n\n"
          b"id: 8\n\n"
          b"data\ndata: x\nfoo: bar\n\n"
          b"data: last")
EXPECTED = [Event("first", b"a\nb\n c"), Event("message", b"\nx"), Event("message", b"last")]


def _decode(pieces: list[bytes]) -> list[Event]:
    decoder = EventStreamDecoder()
    events = [e for piece in pieces for e in decoder.feed(piece)]
    return events + decoder.close()


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_events_whatever_their_line_ends_and_splits(end: bytes) -> None:
    """The same events for LF, CRLF and CR line ends, the stream given whole, a byte at a
    time, or cut at random points (a CRLF split between two reads is one line end, not a
    blank line); the last event, with no blank line after it, dispatched at the end."""
    data = STREAM.replace(b"\n", end)
    assert _decode([data]) == EXPECTED
    assert _decode([data[i:i + 1] for i in range(len(data))]) == EXPECTED
    rng = random.Random(0)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(data)), 8))
        assert _decode([data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]) == EXPECTED


def test_mixed_line_ends_a_byte_order_mark_and_an_unended_last_line() -> None:
    """A BOM first is dropped; CR, LF and CRLF mixed in one stream; a CR just before the end
    and a last line without any line end each still end their event."""
    assert _decode([b"\xef\xbb\xbfdata: 1\r\rdata: 2\n\r\ndata: 3\r"]) == [
        Event("message", b"1"), Event("message", b"2"), Event("message", b"3")]
    assert _decode([b"data: 1\n", b"data: 2"]) == [Event("message", b"1\n2")]
    assert _decode([b": only a comment\n", b"event: x\n"]) == []


def test_a_line_too_long_is_an_error() -> None:
    """A line past ``MAX_LINE_BYTES`` (no line end in sight) is a ``ValueError``, not memory
    without end; one just under it is read."""
    decoder = EventStreamDecoder()
    piece = b"x" * (MAX_LINE_BYTES // 4)
    decoder.feed(b"data: ")
    for _ in range(3):
        decoder.feed(piece)
    assert decoder.feed(b"\n\n") == [Event("message", piece * 3)]
    with pytest.raises(ValueError, match="line is over"):
        for _ in range(5):
            decoder.feed(piece)


def _split(data_line: bytes) -> bytes:
    """A ``chunk`` event with its JSON over several ``data:`` lines (at every ", ")."""
    payload = data_line[len(b"data: "):].rstrip(b"\n")
    return b"data: " + payload.replace(b", ", b",\ndata: ") + b"\n\n"


def _run(tmp_path: Path, lines_of: list[list[bytes]]) -> tuple:
    """Request i gets ``lines_of[i]``; returns (exit status, frame)."""
    async def answer(request: web.Request, body: dict, n: int) -> web.StreamResponse:
        return await stream(request, lines_of[int(body["prompt"][1:])])

    out = tmp_path / "r.parquet"
    with FakeServer(answer) as server:
        status = main(["loadgen", str(workload(tmp_path / "w.jsonl", len(lines_of))),
                       "--url", server.url, "--max-concurrency", "4", "--out", str(out)])
    return status, read_result(out)[0]


def test_an_event_over_several_data_lines_is_one_chunk(tmp_path: Path) -> None:
    """Each chunk's JSON over several ``data:`` lines (the spec joins them with "\\n"); with a
    comment and an ``id:`` inside an event; with CR line ends; the last event split and sent
    without a blank line or [DONE]: every request reads its three tokens (was: each line
    parsed alone, every request failed as "malformed event-stream data")."""
    plain = tokens(3)
    split = [_split(line) if line.startswith(b"data: {") else line for line in plain]
    noted = [line.replace(b",\ndata: ", b",\n: keep-alive\nid: 1\ndata: ", 1) for line in split]
    cr = [line.replace(b"\n", b"\r") for line in split]
    unended = [*split[:-2], split[-2].rstrip(b"\n")]  # its usage event last, no [DONE]
    status, frame = _run(tmp_path, [split, noted, cr, unended])
    assert status == 0, frame["error"].tolist()
    assert (frame["error"] == "").all()
    assert frame["completion_tokens"].tolist() == [3, 3, 3, 3]
    assert frame["finish_reason"].tolist() == ["length"] * 4
    assert frame["token_source"].tolist() == ["usage"] * 4
    assert all(len(itl) == 2 for itl in frame["itl_s"])


def test_an_error_event_over_several_lines_fails_with_its_message(tmp_path: Path) -> None:
    """``event: error`` with an OpenAI error object over two ``data:`` lines, after a token:
    that request fails with the object's message (the client reads errors from the data's
    ``error``, whatever the event's type), the other is measured (was: the first line parsed
    alone, "malformed event-stream data")."""
    error = json.dumps({"error": {"message": "overloaded", "code": 503}}).encode()
    event = b"event: error\ndata: " + error.replace(b", ", b",\ndata: ") + b"\n\n"
    status, frame = _run(tmp_path, [[chunk(" a"), event, *tokens(0)], tokens(2)])
    assert status == 1
    assert frame["error"].tolist() == ["overloaded", ""]


def test_an_error_event_without_an_error_object_fails_at_once(tmp_path: Path) -> None:
    """``event: error`` whose data is no ``error`` object (plain text; text too long to quote
    whole; FastAPI's ``detail``): the request fails at that event with a message quoting its
    data, the tokens after it not read (was: the event ignored, the request failing later as
    "cut short", or answered as if nothing had happened)."""
    long = b"x" * 500
    events = [b"event: error\ndata: upstream\ndata: overloaded\n\n",
              b"event: error\ndata: " + long + b"\n\n",
              b'event: error\ndata: {"detail": "worker died"}\n\n']
    status, frame = _run(tmp_path, [[chunk(" a"), events[0], chunk(" b")],
                                    [chunk(" a"), events[1], *tokens(2)],
                                    [events[2], *tokens(2)], tokens(2)])
    assert status == 1
    prefix = "the server sent an error event: "
    assert frame["error"].tolist() == [prefix + "upstream overloaded",
                                       prefix + "x" * 120 + "...", prefix + "worker died", ""]
    assert frame["completion_tokens"].tolist()[:2] == [1, 1]
