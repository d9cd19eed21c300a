"""Length-prefixed messages survive reads that stop anywhere inside a message (the frontend's
non-blocking end) and say when the writer is gone."""

from __future__ import annotations

import os
import pickle
import sys

import pytest

from engine.server.frames import HEADER, MessageReader, pipe_room, write_message


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    return read_fd, write_fd


def test_a_message_split_anywhere_comes_out_whole() -> None:
    read_fd, write_fd = _pipe()
    reader = MessageReader(read_fd)
    messages = [("out", list(range(n)), [(n, "length")], [], None) for n in (0, 1, 300)]
    frames = b"".join(HEADER.pack(len(p)) + p for p in map(pickle.dumps, messages))
    got = []
    for cut in range(0, len(frames), 7):  # every 7 bytes a read that ends mid-message
        os.write(write_fd, frames[cut:cut + 7])
        got += reader.read_available()
    assert got == messages
    assert reader.read_available() == []  # nothing readable: no wait, nothing invented
    os.close(write_fd)
    with pytest.raises(EOFError):
        reader.read_available()
    os.close(read_fd)


def test_read_one_waits_then_reads_what_write_message_wrote() -> None:
    read_fd, write_fd = os.pipe()
    reader = MessageReader(read_fd)
    assert reader.read_one(0.05) is None  # nothing within the timeout
    write_message(write_fd, ("ready", {"a": 1}))
    write_message(write_fd, ("closed", None, None))
    assert reader.read_one(1.0) == ("ready", {"a": 1})
    assert reader.read_one(1.0) == ("closed", None, None)
    os.close(write_fd)
    with pytest.raises(EOFError):
        reader.read_one(1.0)
    os.close(read_fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipe sizes are Linux's")
def test_pipe_room_counts_unread_bytes_against_half_the_capacity() -> None:
    """The frontend writes a command itself only within ``pipe_room``: it must shrink by what
    the reader has not read and grow back when it reads."""
    read_fd, write_fd = _pipe()
    empty = pipe_room(write_fd)
    assert empty is not None and empty > 0
    os.write(write_fd, b"x" * 1000)
    assert pipe_room(write_fd) == empty - 1000
    os.read(read_fd, 600)
    assert pipe_room(write_fd) == empty - 400
