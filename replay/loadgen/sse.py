"""Server-sent events, decoded as the WHATWG HTML spec's event-stream parser does, as far as an
OpenAI-style stream needs it.

Lines end in CRLF, LF or CR (a CR at the end of one network read and an LF at the start of the
next are one line end). A blank line ends an event; its ``data:`` lines are joined with "\\n".
A field's value loses one leading space (``data:x`` and ``data: x`` are the same); a line
starting with ":" is a comment (``: ping``). ``event:`` names the event; ``id:``, ``retry:`` and
unknown fields are ignored (a load generator neither reconnects nor resumes). One leniency past
the spec: an event still open when the stream ends is dispatched, not dropped, so a server
that omits the final blank line loses no chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# One line end: CRLF first, so that it counts once.
_LINE_END = re.compile(rb"\r\n|\r|\n")
BOM = b"\xef\xbb\xbf"
# A line longer than this is an error, not unbounded memory (the client read lines of up to 2
# MiB before: a long chunk is not an error).
MAX_LINE_BYTES = 2**21


@dataclass(frozen=True)
class Event:
    """One dispatched event: its type (``event:``; "message" when none) and its joined data."""

    type: str
    data: bytes


class EventStreamDecoder:
    """Feed it the body's bytes as they arrive (``feed``), then ``close`` at the end of the
    stream; each returns the events completed by what it was given, in order."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # the line not ended yet, as it came
        self._held = 0  # its bytes
        self._skip_lf = False  # the last read ended in CR: an LF first in the next is its pair
        self._started = False  # past a possible byte-order mark
        self._data: list[bytes] = []
        self._type = b""

    def feed(self, chunk: bytes) -> list[Event]:
        """The events that ``chunk`` (the next bytes of the stream) completes; a
        ``ValueError`` for a line over ``MAX_LINE_BYTES``."""
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not chunk:
            return []
        self._skip_lf = chunk[-1:] == b"\r"
        if b"\n" not in chunk and b"\r" not in chunk:  # a piece of a long line: no copying
            self._hold(chunk)
            return []
        if self._parts:
            chunk = b"".join(self._parts) + chunk
            self._parts, self._held = [], 0
        lines = _LINE_END.split(chunk)
        self._hold(lines.pop())  # after the last line end: the start of the next line
        events: list[Event] = []
        for line in lines:
            self._line(line, events)
        return events

    def close(self) -> list[Event]:
        """The events the end of the stream completes: an unended last line, then an event
        without its blank line (dispatched, past the spec: see the module's docstring)."""
        events: list[Event] = []
        if self._parts:
            line = b"".join(self._parts)
            self._parts, self._held = [], 0
            self._line(line, events)
        self._line(b"", events)
        return events

    def _hold(self, piece: bytes) -> None:
        if piece:
            self._held += len(piece)
            if self._held > MAX_LINE_BYTES:
                raise ValueError(f"an event-stream line is over {MAX_LINE_BYTES} bytes")
            self._parts.append(piece)

    def _line(self, line: bytes, events: list[Event]) -> None:
        if not self._started:
            self._started = True
            if line.startswith(BOM):
                line = line[len(BOM):]
        if not line:  # a blank line dispatches the event, if it has data
            if self._data:
                events.append(Event(self._type.decode("utf-8", "replace") or "message",
                                    b"\n".join(self._data)))
            self._data, self._type = [], b""
            return
        if line[:1] == b":":  # a comment
            return
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._type = value
