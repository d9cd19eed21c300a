"""The trace writer in a child process: ``SegmentWriter``'s interface, its work done elsewhere.

The threaded writer shares the engine's interpreter: its Parquet encoding, compression and
syncing run beside the engine's thread, which then waits for the GIL and the allocator when it
returns from the device. Here the engine's thread only saves each segment's Arrow tables as
one file of Arrow IPC streams in a private temporary folder (one copy into the page cache) and
sends one line naming it; a child process (``python -m tracing.segment_process``) runs a
``SegmentWriter`` on them, in order, and answers one line per segment. The child owns nothing
the engine needs: if the engine is killed, the child still commits every segment it was sent,
then exits at the end of its input.

Protocol (one JSON object per line): to the child ``{"index", "through_step", "first_event_id",
"last_event_id", "file", "streams": {kind: [start, size]}}`` (each kind's table an Arrow IPC
stream at that place in the file); from it ``{"index", "bytes", "write_s", "write_cpu_s"}``
per committed segment, or ``{"error": message}`` once, after which it commits nothing more.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracing.errors import TraceError
from tracing.interrupt_guard import sigint_deferred
from tracing.outdir import write_all
from tracing.segment_writer import MAX_PENDING_SEGMENTS, Segment, SegmentWriter

# Staging files reused in turn (see ProcessSegmentWriter.submit).
STAGING_SLOTS = MAX_PENDING_SEGMENTS + 2
# How long shutdown waits for the child to finish what it was sent.
SHUTDOWN_TIMEOUT_S = 600.0


class ProcessSegmentWriter:
    """Writes segments of one trace directory through a child process. Errors (the child's, or
    its death) surface as ``TraceError`` from ``submit``, ``drain`` or ``shutdown``."""

    def __init__(self, root: Path, fsync: bool) -> None:
        self.root = root
        self.failed: TraceError | None = None
        self.bytes_written = 0
        self.write_s = 0.0  # as the child measured it
        self.write_cpu_s = 0.0
        self._staging = Path(tempfile.mkdtemp(prefix="replayllm-segments-"))
        self._pending: list[int] = []  # indices sent, not yet acknowledged, in order
        self._received = b""
        # The child must import this repository's modules as the parent does.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._child = subprocess.Popen(
            [sys.executable, "-m", "tracing.segment_process", str(root), str(int(fsync)),
             str(self._staging)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        # A process that leaves without closing the recorder still waits for what it handed
        # over, as the threaded writer's interpreter does for its threads.
        self._end = weakref.finalize(self, _end_child, self._child, self._staging)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self._child.pid

    def submit(self, segment: Segment) -> None:
        """Hand ``segment`` to the child after the ones before it; wait while too many are in
        flight."""
        self._raise_if_failed()
        # Every kind's table as one Arrow IPC stream, back to back in memory (no copy of the
        # columns beyond this one, the GIL released), then one write into the page cache.
        encoded = pa.BufferOutputStream()
        streams = {}
        # A few files written over in turn: a new file's pages cost as much as the copy itself
        # (~1 GB/s), a written one's are reused. A slot comes round again only after the child
        # answered for the segment that used it (at most MAX_PENDING_SEGMENTS + 1 in flight).
        path = self._staging / f"slot-{segment.index % STAGING_SLOTS}.arrows"
        try:
            for kind, table in segment.tables.items():
                start = encoded.tell()
                with pa.ipc.new_stream(encoded, table.schema) as out:
                    out.write_table(table)
                streams[kind] = [start, encoded.tell() - start]
            data = encoded.getvalue()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                write_all(fd, data)
                os.ftruncate(fd, data.size)
            finally:
                os.close(fd)
        except (OSError, pa.ArrowException) as exc:
            self.failed = TraceError(f"{path}: cannot stage segment ({exc})")
            raise self.failed from None
        message = {"index": segment.index, "through_step": segment.through_step,
                   "first_event_id": segment.first_event_id,
                   "last_event_id": segment.last_event_id, "file": str(path),
                   "streams": streams}
        self._send(message)
        self._pending.append(segment.index)
        if len(self._pending) > MAX_PENDING_SEGMENTS:
            self.drain(wait_all=False, wait_one=True)

    def drain(self, wait_all: bool, wait_one: bool = False) -> None:
        """Collect the child's answers (re-raising its error); wait for one or all if asked."""
        while self._pending:
            block = wait_all or wait_one
            if not self._receive(block):
                break
            wait_one = False
        self._raise_if_failed()

    def shutdown(self) -> None:
        """End the child's input, wait for it to commit what it was sent, remove the staging
        folder."""
        try:
            if self._child.stdin is not None and not self._child.stdin.closed:
                with contextlib.suppress(OSError):
                    self._child.stdin.close()
            while self._pending and self._receive(block=True):
                pass
        finally:
            self._end()

    def _send(self, message: dict[str, Any]) -> None:
        assert self._child.stdin is not None
        try:
            self._child.stdin.write(json.dumps(message).encode() + b"\n")
            self._child.stdin.flush()
        except (BrokenPipeError, OSError):
            self._died()

    def _receive(self, block: bool) -> bool:
        """Read the child's next answer line; False when none is there (``block=False``)."""
        assert self._child.stdout is not None
        fd = self._child.stdout.fileno()
        while b"\n" not in self._received:
            # Waiting may be interrupted (Ctrl-C); taking what came, and an answer with its
            # segment, may not: either half alone loses an answer or misreads the next one.
            if not select.select([fd], [], [], None if block else 0)[0]:
                return False
            with sigint_deferred():
                chunk = os.read(fd, 65536)
                if not chunk:
                    self._died()
                self._received += chunk
        with sigint_deferred():
            return self._take_answer()

    def _take_answer(self) -> bool:
        """Consume the first answer line received: its segment is committed."""
        line, self._received = self._received.split(b"\n", 1)
        answer = json.loads(line)
        if "error" in answer:
            self.failed = TraceError(answer["error"])
            self._pending.clear()
            raise self.failed
        assert answer["index"] == self._pending[0], "the child commits in order"
        self._pending.pop(0)
        self.bytes_written += answer["bytes"]
        self.write_s += answer["write_s"]
        self.write_cpu_s += answer["write_cpu_s"]
        return True

    def _died(self) -> None:
        code = self._child.poll()
        self.failed = TraceError(
            f"{self.root}: the trace writer process ended "
            f"({'still running' if code is None else f'exit code {code}'}) with "
            f"{len(self._pending)} segment(s) unwritten")
        self._pending.clear()
        raise self.failed

    def _raise_if_failed(self) -> None:
        if self.failed is not None:
            raise self.failed


def _end_child(child: subprocess.Popen[bytes], staging: Path) -> None:
    """Close the child's input and output, wait for it to finish, remove ``staging``."""
    for stream in (child.stdin, child.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()  # unread answers: the child goes on without telling
    try:
        child.wait(timeout=SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    shutil.rmtree(staging, ignore_errors=True)


def serve(root: Path, fsync: bool, lines: Any, answer: Any) -> None:
    """The child's loop: write each segment ``lines`` names, in order, answering on
    ``answer``; after an error, answer it once and commit nothing more. An engine that is gone
    reads no answers: what it sent is still committed."""
    writer = SegmentWriter(root, background=True, fsync=fsync)
    listening = True

    def tell(message: dict[str, Any]) -> None:
        nonlocal listening
        if listening:
            try:
                answer.write(json.dumps(message) + "\n")
                answer.flush()
            except (BrokenPipeError, OSError):
                listening = False

    try:
        for line in lines:
            message = json.loads(line)
            try:
                tables = _read_streams(message["file"], message["streams"])
                segment = Segment(message["index"], message["through_step"], tables,
                                  message["first_event_id"], message["last_event_id"])
                before = writer.bytes_written, writer.write_s, writer.write_cpu_s
                writer.write(segment)
            except (OSError, pa.ArrowException) as exc:
                tell({"error": f"{root}: cannot read a staged segment ({exc})"})
                return
            except TraceError as exc:
                tell({"error": str(exc)})
                return
            tell({"index": segment.index, "bytes": writer.bytes_written - before[0],
                  "write_s": writer.write_s - before[1],
                  "write_cpu_s": writer.write_cpu_s - before[2]})
    finally:
        writer.shutdown()


def _read_streams(path: str, streams: dict[str, list[int]]) -> dict[str, pa.Table]:
    """The tables of a staged segment file (each kind's stream at [start, size])."""
    with pa.memory_map(path) as source:
        data = source.read_buffer()
    return {kind: pa.ipc.open_stream(data.slice(start, size)).read_all()
            for kind, (start, size) in streams.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m tracing.segment_process ROOT FSYNC STAGING``: serve the engine on stdin and
    stdout, then remove its staging folder (the engine may be gone)."""
    args = sys.argv[1:] if argv is None else argv
    root, fsync, staging = Path(args[0]), args[1] == "1", Path(args[2])
    # The engine ends this process by closing its input; a signal meant for the engine's group
    # (Ctrl-C, a supervisor's SIGTERM) must not cut off the segments it already handed over.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Answers go to the original stdout; anything else printing there goes to stderr.
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        serve(root, fsync, sys.stdin, answer)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
