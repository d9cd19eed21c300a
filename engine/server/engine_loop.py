"""The engine thread: ``drive`` over the server's request queue, never waiting on HTTP work.

The frontend (the asyncio thread serving HTTP) tokenizes a request and ``submit``s a
``RequestStream``; the engine thread feeds it to the engine at the next step boundary (its
arrival, stamped as the frontend submits it, is what the trace records), steps the engine, and
hands each step's new tokens to the streams in one ``call_soon_threadsafe`` per step. The
frontend detokenizes and streams. A client that goes away, or a stop string found in the text,
comes back as ``finish(stream, "aborted" | "stop")``: an engine input like any other, recorded.
Nothing is kept per request once it finished (``EngineCore.forget``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine.drive import drive
from engine.engine_core import EngineCore, StepResult
from engine.llm import LLMEngine
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.server.step_stats import StatsApplier, TokenClock, state_stats, step_stats

log = logging.getLogger(__name__)

# How long the idle engine thread sleeps between checks when nothing wakes it.
IDLE_WAIT_S = 0.5
NO_SEQ = -1
T = TypeVar("T")


class EngineStopped(Exception):
    """The engine takes no more requests (shutting down, or it failed): what ``submit`` raises,
    and the error a submitted request's stream gets when the engine stopped before finishing
    it (the server answers both with a 503)."""


@dataclass(eq=False)
class RequestStream:
    """One request between the frontend and the engine thread.

    ``queue`` (on the frontend's event loop) receives ``(token_ids, finish_reason, error)``
    items: new tokens of a step, the engine's finish reason when it finished, or an error: the
    engine's refusal of the request (a str) or ``EngineStopped`` (it stopped before finishing
    the request).
    """

    token_ids: list[int]
    params: SamplingParams
    # On the engine's clock (``EngineLoop.now``): the frontend stamps it as it submits, on its
    # one event-loop thread, so arrivals are nondecreasing in the order of submission.
    arrival_s: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    seq_id: int = NO_SEQ  # set by the engine thread when it is added
    answered: bool = False  # a token has been handed to ``queue`` (``put_all``)
    priority: int = 0  # lower is served first under policy=priority (the request's own)


# What the engine hands a stream: ``(stream, token_ids, finish_reason, error)``.
Delivery = tuple[RequestStream, list[int], str | None, str | EngineStopped | None]


def abort_all(core: EngineCore, held: dict[int, T], on_result: Callable[[StepResult, float],
              None], now: float) -> list[T]:
    """A stopping server's end of its requests (its grace period over), for both engine loops
    (``EngineLoop``, ``engine_proc.PipeInputs``): first the step still in flight resolved, every
    result ``core`` has not returned yet going to ``on_result`` (which takes the requests it
    finishes out of ``held``); then every request still in ``held`` (engine ``seq_id`` -> the
    loop's handle on it) aborted and forgotten. ``held`` is left empty; the handles of the
    aborted, returned. Under async scheduling (the default, the CPU runner's too) the last step
    launched has sampled a token of each running request, and finished those it brought to
    ``max_tokens``: aborted without it, a client got ``abort`` a token short of the ``length``
    its trace holds, and an aborted one a token fewer than its trace counts."""
    while (result := core.step(decide=False)) is not None:
        on_result(result, now)
    aborted = list(held.values())
    for seq_id in held:
        core.finish(seq_id, "aborted")
        core.forget(seq_id)
    held.clear()
    return aborted


class RequestIntake:
    """What both engine handles (``EngineLoop`` here, ``EngineProcess`` in engine_client.py)
    keep of the requests they hold: the intake gate, the count of requests submitted and not yet
    finished (guarded by ``_cond``), and the metrics the engine's state goes to."""

    def __init__(self, metrics: Any) -> None:
        self._cond = threading.Condition()
        self._num_active = 0
        self._accepting = True
        self.error: BaseException | None = None
        self.set_metrics(metrics)

    @property
    def num_active(self) -> int:
        return self._num_active

    def set_metrics(self, metrics: Any) -> None:
        self.metrics = metrics
        self._stats = StatsApplier(metrics)

    def _count_in(self) -> None:
        """Count one more request in (``_cond`` held); ``EngineStopped`` when not accepting."""
        if not self._accepting or self.error is not None:
            raise EngineStopped("the server is shutting down" if self.error is None
                                else f"the engine failed: {self.error}")
        self._num_active += 1

    def _retire(self, count: int) -> None:
        if count:
            with self._cond:
                self._num_active -= count
                self._cond.notify_all()

    def _drain(self, grace_s: float, gone: Any) -> None:
        """Stop intake and wait (``_cond`` held) up to ``grace_s`` seconds for every request to
        finish, or for ``gone()``: the engine can finish no more."""
        self._accepting = False
        deadline = time.monotonic() + grace_s
        while self._num_active and not gone():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(min(left, IDLE_WAIT_S))


class EngineLoop(RequestIntake):
    """Runs an ``LLMEngine`` in its own thread over the requests the frontend submits.

    ``metrics`` (``engine.server.metrics.ServerMetrics``) gets the engine's state after every
    step. ``start(loop)`` starts the thread; ``shutdown(grace_s)`` stops intake, lets running
    requests finish for up to ``grace_s`` seconds, aborts the rest and closes the trace.
    """

    def __init__(self, llm: LLMEngine, metrics: Any = None) -> None:
        super().__init__(metrics)
        self.llm = llm
        self.core: EngineCore = llm.core
        self.token_clock = TokenClock()  # the inter-token latencies of its steps
        self._commands: deque[tuple[str, RequestStream, str]] = deque()
        self._streams: dict[int, RequestStream] = {}  # engine thread only
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.summary: dict[str, Any] | None = None

    # --- frontend side (any thread) ---------------------------------------------------------------
    # What the frontend needs of the engine (the same on ``EngineProcess``).
    @property
    def tokenizer(self) -> Any:
        return self.llm.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.llm.config.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.llm.vocab_size

    def admission_error(self, token_ids: list[int], params: SamplingParams) -> str | None:
        """Why the engine could never serve this request (``Scheduler.admission_error``)."""
        return self.core.scheduler.admission_error(Sequence(NO_SEQ, token_ids, params))

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="replayllm-engine", daemon=True)
        self._thread.start()

    def now(self) -> float:
        """Seconds on the engine's clock (what ``arrival_s`` and the trace use)."""
        return self.core.now()

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    def submit(self, stream: RequestStream) -> None:
        """Queue a request for the next step boundary; ``EngineStopped`` when not accepting."""
        with self._cond:
            self._count_in()
            self._commands.append(("add", stream, ""))
            self._cond.notify()

    def finish(self, stream: RequestStream, reason: str) -> None:
        """Finish a request from outside: ``aborted`` (the client left) or ``stop``."""
        with self._cond:
            self._commands.append(("finish", stream, reason))
            self._cond.notify()

    def shutdown(self, grace_s: float) -> dict[str, Any] | None:
        """Stop intake; wait up to ``grace_s`` for running requests; abort the rest; close the
        trace (its summary is returned). Blocks; idempotent."""
        with self._cond:
            self._drain(grace_s, lambda: self.error is not None)
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        return self.summary

    # --- engine thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            drive(self.core, self, self.core.now, self._wait_until)
        except BaseException as exc:  # the engine's failure must reach every waiting client
            log.exception("engine loop failed")
            self.error = exc
            self._fail_all(f"the engine failed: {exc}")
        finally:
            try:
                self.summary = self.llm.close()
            except Exception as exc:  # noqa: BLE001 - the trace's error is the user's one line
                log.error("closing the engine failed: %s", exc)
                self.error = self.error or exc

    def _wait_until(self, due: float) -> None:
        with self._cond:
            if not self._commands and not self._stop:
                self._cond.wait(IDLE_WAIT_S)

    def feed(self, core: EngineCore, now: float) -> None:
        """Add and finish what the frontend queued (the ``Inputs`` protocol)."""
        if not self._commands and not self._stop:
            return
        with self._cond:
            commands = list(self._commands)
            self._commands.clear()
        deliveries: list[Delivery] = []
        ended = False  # a request ended here, between steps: the gauges need its change
        for action, stream, reason in commands:
            if action == "add":
                self._add(core, stream, deliveries)
            elif stream.seq_id in self._streams:
                del self._streams[stream.seq_id]
                core.finish(stream.seq_id, reason)
                core.forget(stream.seq_id)
                self._retire(1)
                ended = True
        if ended and self.metrics is not None:
            self._stats.apply(state_stats(core))
        if self._stop:  # the grace period is over: abort what is left
            aborted = abort_all(core, self._streams, self.on_result, now)
            deliveries.extend((stream, [], "aborted", None) for stream in aborted)
            self._retire(len(aborted))
        self._deliver(deliveries)

    def _add(self, core: EngineCore, stream: RequestStream, deliveries: list) -> None:
        if self._stop:  # submitted before intake stopped, not taken before the grace ended
            deliveries.append((stream, [], None, EngineStopped("the server is shutting down")))
            self._retire(1)
            return
        seq = core.add_request(stream.token_ids, stream.params, arrival_s=stream.arrival_s,
                               priority=stream.priority)
        stream.seq_id = seq.seq_id
        rejection = core.rejections.get(seq.seq_id)
        if rejection is not None:
            core.forget(seq.seq_id)
            deliveries.append((stream, [], None, rejection))
            self._retire(1)
            return
        self._streams[seq.seq_id] = stream

    def next_due(self) -> float | None:
        if self._stop and not self._commands:
            return None
        return float("inf")  # whenever the frontend submits: ``_wait_until`` wakes on it

    def on_result(self, result: StepResult, now: float) -> None:
        """Hand the step's tokens and finishes to their streams (one event-loop call)."""
        streams = self._streams
        deliveries: list[Delivery] = []
        finished = {seq.seq_id: seq.finish_reason for seq in result.finished}
        for seq, token in zip(result.batch.sampled_seqs, result.output.token_ids):
            stream = streams.get(seq.seq_id)
            if stream is not None:
                deliveries.append((stream, [token], finished.pop(seq.seq_id, None), None))
        for seq_id, reason in finished.items():  # finished without a token of this step
            stream = streams.get(seq_id)
            if stream is not None:
                deliveries.append((stream, [], reason, None))
        for seq in result.finished:
            if streams.pop(seq.seq_id, None) is not None:
                self.core.forget(seq.seq_id)
                self._retire(1)
        self._deliver(deliveries)
        if self.metrics is not None:
            self._observe(result)

    def _deliver(self, deliveries: list) -> None:
        if deliveries and self._loop is not None:
            self._loop.call_soon_threadsafe(put_all, deliveries)

    def _fail_all(self, message: str) -> None:
        with self._cond:
            self._accepting = False
            pending = [stream for _, stream, _ in self._commands]
            self._commands.clear()
        streams = list(self._streams.values()) + pending
        self._streams.clear()
        self._deliver([(stream, [], None, EngineStopped(message)) for stream in streams])
        self._retire(len(streams))

    def _observe(self, result: StepResult) -> None:
        """Engine state after a step, for /metrics."""
        self._stats.apply(step_stats(self.core, result, self.token_clock))


def put_all(deliveries: list[Delivery]) -> None:
    """Put each ``(stream, tokens, finish_reason, error)`` on its stream's queue (event-loop
    thread), first tokens before the rest: the streams' tasks run in the order their queues
    got an item, and a request's first token would otherwise wait, as its TTFT, behind the
    chunks of every other stream of the step. A stream's own items keep their order."""
    later = []
    for delivery in deliveries:
        stream, tokens = delivery[0], delivery[1]
        if tokens and not stream.answered:
            stream.answered = True
            stream.queue.put_nowait(delivery[1:])
        else:
            later.append(delivery)
    for stream, tokens, reason, error in later:  # a token here: the stream is answered already
        stream.queue.put_nowait((tokens, reason, error))
