"""The frontend's handle on the engine process (``engine.server.engine_proc``): the same
interface as the in-thread ``EngineLoop`` (submit, finish, shutdown, now, ...).

The event loop reads the engine's outputs itself (``add_reader`` on the output pipe, read as
``engine.server.frames`` messages, that end non-blocking); each request's
tokens go to its ``RequestStream`` queue. The event loop never blocks on the command pipe: it
writes a command itself only when nothing is queued before it and the pipe has room for it
(``frames.pipe_room``), and otherwise leaves it to a sender thread. Were the loop to block in a
write (the engine's end full while the engine itself waits to write its outputs, which only
this loop reads), neither side could go on; were every command left to the thread, an add would
wait for the thread to get the interpreter, which a busy loop holds for milliseconds.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import threading
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any

from engine.errors import ReplayLLMError
from engine.gc_heap import freeze_startup_heap, release_heap
from engine.prompt_ids import int32_ids
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.server.engine_loop import (
    NO_SEQ,
    EngineStopped,
    RequestIntake,
    RequestStream,
    put_all,
)
from engine.server.engine_proc import EngineInfo, EngineSpec, PipeCounts, spawn_engine
from engine.server.frames import MessageReader, pipe_room
from engine.server.step_stats import StepStats
from tracing.events import NullEventBuffer

log = logging.getLogger(__name__)

# What ``Connection.send_bytes`` writes before a payload, at most (a length of 4 or 12 bytes).
CONNECTION_HEADER_BYTES = 16
START_TIMEOUT_S = 3600.0  # a large checkpoint's load and graph capture
CLOSE_TIMEOUT_S = 300.0  # the engine closing its trace after ``stop``


class EngineProcess(RequestIntake):
    """Starts the engine process (blocking until its model is loaded) and talks to it.

    ``start(loop)`` starts the reader thread delivering to ``loop``; ``shutdown(grace_s)``
    stops intake, lets running requests finish for up to ``grace_s``, then has the engine
    abort the rest and close the trace (its summary is returned).
    """

    def __init__(self, spec: EngineSpec, metrics: Any = None) -> None:
        from engine.model.tokenizer import load_tokenizer

        self.process, self.conn, self._outputs = spawn_engine(spec)
        self._reader = MessageReader(self._outputs.fileno())
        try:
            message = self._reader.read_one(START_TIMEOUT_S)
        except EOFError:
            self.process.join(5)
            raise ReplayLLMError(f"the engine process exited ({self.process.exitcode}) "
                                 "while starting") from None
        except BaseException:  # Ctrl-C twice while starting: the engine goes too, at once
            self.process.kill()
            self.process.join(5)
            raise
        if message is None:
            self.process.kill()
            raise ReplayLLMError("the engine process did not start")
        if message[0] == "failed":
            self.process.join(30)
            raise ReplayLLMError(message[1])
        info: EngineInfo = message[1]
        self.info = info
        self.config = info.config
        self.tokenizer = load_tokenizer(self.config.model)
        # For ``admission_error`` only: the same rule the engine's scheduler applies.
        self._admission = Scheduler(self.config, self.config.num_kvcache_blocks,
                                    NullEventBuffer())
        super().__init__(metrics)
        self._streams: dict[int, RequestStream] = {}  # event-loop thread only
        self._ids = itertools.count()
        self._outbox: queue.SimpleQueue[tuple[str, bytes] | None] = queue.SimpleQueue()
        self._write_lock = threading.Lock()  # one writer of the command pipe at a time
        self._queue_lock = threading.Lock()
        self._queued = 0  # commands in the outbox or being written by the sender thread
        self._sender = threading.Thread(target=self._send_loop, name="replayllm-engine-send",
                                        daemon=True)
        self._sender.start()
        self.counts = PipeCounts("sent", "received")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._closed = threading.Event()
        self.summary: dict[str, Any] | None = None

    # --- what the frontend needs of the engine ----------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    def admission_error(self, token_ids: list[int], params: SamplingParams) -> str | None:
        return self._admission.admission_error(Sequence(NO_SEQ, token_ids, params))

    def now(self) -> float:
        return time.perf_counter() - self.info.start_time

    @property
    def healthy(self) -> bool:
        return self.error is None and not self._closed.is_set() and self.process.is_alive()

    # --- requests (event-loop thread) -------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the engine's outputs on ``loop`` itself (no thread: no GIL hand-over per step)."""
        self._loop = loop
        self._started = True
        os.set_blocking(self._outputs.fileno(), False)  # uvloop would, asyncio does not
        loop.add_reader(self._outputs.fileno(), self._on_readable)
        if self.config.freeze_gc_heap:  # the frontend's start-up heap too (engine/gc_heap.py)
            freeze_startup_heap()

    def submit(self, stream: RequestStream) -> None:
        """Send a request to the engine; ``EngineStopped`` when not accepting."""
        with self._cond:
            self._count_in()
        stream.seq_id = next(self._ids)
        self._streams[stream.seq_id] = stream
        # An int32 array pickles as its bytes: the engine's process unpickles no int a token.
        if not self._send(("add", stream.seq_id, int32_ids(stream.token_ids), stream.params,
                           stream.arrival_s, stream.priority)):
            # The write met a broken pipe: refused as a stopped engine's (a stream's 503 comes
            # before its 200), not failed later through the stream.
            if self._streams.pop(stream.seq_id, None) is not None:
                self._retire(1)
            raise EngineStopped(str(self.error))

    def finish(self, stream: RequestStream, reason: str) -> None:
        """Finish a request from outside: ``aborted`` (the client left) or ``stop``."""
        if self._streams.pop(stream.seq_id, None) is not None:
            self._retire(1)
            self._send(("finish", stream.seq_id, reason))

    def _send(self, message: tuple) -> bool:
        """Write ``message`` to the engine now where that cannot block (nothing queued before
        it, room for it in the pipe); otherwise queue it for the sender thread. Never blocks.
        False: the write met a broken pipe (the engine process is gone)."""
        payload = bytes(ForkingPickler.dumps(message))  # what ``Connection.send`` writes
        if self._write_lock.acquire(blocking=False):
            try:
                room = pipe_room(self.conn.fileno())
                needed = len(payload) + CONNECTION_HEADER_BYTES
                if not self._queued and room is not None and needed <= room:
                    self.conn.send_bytes(payload)
                    self.counts.command(message[0])
                    return True
            except OSError:
                self._pipe_broke()
                return False
            finally:
                self._write_lock.release()
        with self._queue_lock:
            self._queued += 1
        self._outbox.put((message[0], payload))
        return True

    def _pipe_broke(self) -> None:
        """A command could not be written: the engine process is gone (its end closed). Said
        as the reader says it when it finds the process gone (which may come first or after),
        not as the write's ``[Errno 32] Broken pipe``."""
        self.error = self.error or ReplayLLMError("the engine process died")

    def _send_loop(self) -> None:
        """The sender thread: the queued commands to the pipe, in order, until ``None``."""
        while True:
            item = self._outbox.get()
            if item is None:
                return
            kind, payload = item
            try:
                with self._write_lock:
                    self.conn.send_bytes(payload)
            except OSError:
                self._pipe_broke()
                return
            finally:
                with self._queue_lock:
                    self._queued -= 1
            self.counts.command(kind)

    # --- outputs (the event loop) ----------------------------------------------------------------
    def _on_readable(self) -> None:
        """Every message the engine has sent so far (on the event loop)."""
        try:
            for message in self._reader.read_available():
                if message[0] == "out":
                    self.counts.output(message[2], message[3], message[4])
                    try:
                        self._dispatch(message)
                    except Exception:  # noqa: BLE001 - one bad message must not stall the rest
                        log.exception("dispatching the engine's output failed")
                elif message[0] == "closed":
                    self._on_closed(message)
                    return
        except (EOFError, OSError):
            if not self._closed.is_set():
                self.error = self.error or ReplayLLMError("the engine process died")
                self._stop_reading()
                self._closed.set()
                self._fail_all("the engine process died")

    def _on_closed(self, message: tuple) -> None:
        self.summary = message[1]
        if message[2] is not None:
            self.error = ReplayLLMError(message[2])
        self._stop_reading()
        self._closed.set()
        self._fail_all("the server is shutting down" if message[2] is None
                       else f"the engine failed: {message[2]}")

    def _stop_reading(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._outputs.fileno())

    def _dispatch(self, message: tuple) -> None:
        """Hand one step's tokens, finishes and errors to their streams (``put_all``)."""
        _, rids, tokens, finishes, errors, stats = message
        streams = self._streams
        deliveries = []
        for rid, token in zip(rids, tokens):
            stream = streams.get(rid)
            if stream is not None:
                deliveries.append((stream, [token], None, None))
        done = 0
        for rid, reason in finishes:
            stream = streams.pop(rid, None)
            if stream is not None:
                deliveries.append((stream, [], reason, None))
                done += 1
        for rid, error in errors:
            stream = streams.pop(rid, None)
            if stream is not None:
                deliveries.append((stream, [], None, error))
                done += 1
        put_all(deliveries)
        if done:
            self._retire(done)
        if stats is not None and self.metrics is not None:
            self._stats.apply(StepStats(*stats))

    def _fail_all(self, message: str) -> None:
        """End every open request with ``EngineStopped(message)``: the engine stopped (its
        process died or closed) before finishing them; also those just sent down a broken
        pipe (the process dead before its EOF was read)."""
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            stream.queue.put_nowait(([], None, EngineStopped(message)))
        if streams:
            self._retire(len(streams))

    # --- shutdown (any thread) --------------------------------------------------------------------
    def shutdown(self, grace_s: float) -> dict[str, Any] | None:
        """Stop intake; wait up to ``grace_s`` for running requests; have the engine abort the
        rest and close the trace; its summary. Blocks; idempotent."""
        with self._cond:
            self._drain(grace_s, self._closed.is_set)
        if not self._closed.is_set():
            self._send(("stop",))
            if not self._started:  # never started: read the engine's last words here
                self._drain_until_closed()
            elif not self._closed.wait(CLOSE_TIMEOUT_S):
                log.error("the engine process did not close its trace in time")
        self.process.join(CLOSE_TIMEOUT_S)
        self._outbox.put(None)
        if self.config.freeze_gc_heap:
            release_heap()
        return self.summary

    def report(self) -> str:
        """One line on the pipe and the open requests (the server logs it on SIGUSR1)."""
        return f"frontend: {self.counts}, open streams {len(self._streams)}, " \
               f"active {self.num_active}, outbox {self._outbox.qsize()}"

    def _drain_until_closed(self) -> None:
        while True:
            try:
                message = self._reader.read_one(CLOSE_TIMEOUT_S)
            except (EOFError, OSError):
                break
            if message is None:
                break
            if message[0] == "closed":
                self.summary = message[1]
                if message[2] is not None:
                    self.error = ReplayLLMError(message[2])
                break
        self._closed.set()
