"""The engine process's outputs to the frontend: length-prefixed pickled messages on a pipe.

The engine writes each message whole on a blocking end. The frontend's event loop reads its end
itself (``add_reader``), non-blocking (uvloop makes every fd it watches non-blocking; the
frontend does so itself for asyncio's loop): a read may stop inside a message, so
``MessageReader`` keeps the bytes of an incomplete one until the rest arrives
(``multiprocessing.Connection.recv`` cannot: on a non-blocking end it fails part-way through a
message and loses it).
"""

from __future__ import annotations

import os
import pickle
import select
import struct
from typing import Any

HEADER = struct.Struct("!Q")  # the payload's length in bytes
READ_SIZE = 1 << 20
PIPE_SIZE = 1 << 20  # room for many steps' outputs while the frontend is busy (Linux)
F_SETPIPE_SZ = 1031
F_GETPIPE_SZ = 1032
# A pipe holds its bytes in page-sized slots, which a write may not fill: count on half.
PIPE_SLACK = 2


def widen_pipe(fd: int) -> None:
    """Ask Linux for a 1 MiB pipe buffer (best effort: the default 64 KiB works, with less
    slack before the engine waits on a busy frontend)."""
    try:
        import fcntl

        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    except (ImportError, OSError):
        pass


def pipe_room(fd: int) -> int | None:
    """Bytes a blocking write to the pipe end ``fd`` can surely take without waiting: half its
    capacity less what the reader has not read yet (Linux); None where that is not known."""
    try:
        import fcntl
        import termios

        capacity = fcntl.fcntl(fd, F_GETPIPE_SZ)
        unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except (ImportError, OSError, AttributeError):
        return None
    return capacity // PIPE_SLACK - unread


def write_message(fd: int, message: Any) -> None:
    """Write ``message`` whole to the blocking pipe end ``fd`` (``OSError`` if it is closed)."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


class MessageReader:
    """Whole messages from the read end ``fd``, blocking or not."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()
        self._eof = False

    def read_available(self) -> list[Any]:
        """Every whole message readable now, without waiting (the end must be non-blocking);
        ``EOFError`` once the writer is gone and no whole message is left."""
        while not self._eof:
            try:
                chunk = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                break
            if not chunk:
                self._eof = True
                break
            self._buffer += chunk
        messages = self._whole_messages()
        if not messages and self._eof:
            raise EOFError("the engine process closed its pipe")
        return messages

    def read_one(self, timeout_s: float) -> Any | None:
        """The next message, waiting up to ``timeout_s`` (None: none came); ``EOFError`` once
        the writer is gone."""
        while True:
            messages = self._whole_messages(limit=1)
            if messages:
                return messages[0]
            if self._eof:
                raise EOFError("the engine process closed its pipe")
            ready, _, _ = select.select([self.fd], [], [], timeout_s)
            if not ready:
                return None
            chunk = os.read(self.fd, READ_SIZE)
            if not chunk:
                self._eof = True
            self._buffer += chunk

    def _whole_messages(self, limit: int | None = None) -> list[Any]:
        messages: list[Any] = []
        buffer, offset = self._buffer, 0
        while len(buffer) - offset >= HEADER.size and (limit is None or len(messages) < limit):
            (size,) = HEADER.unpack_from(buffer, offset)
            end = offset + HEADER.size + size
            if len(buffer) < end:
                break
            messages.append(pickle.loads(buffer[offset + HEADER.size:end]))
            offset = end
        if offset:
            del buffer[:offset]
        return messages
