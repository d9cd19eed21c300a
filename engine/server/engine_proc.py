"""The engine core in its own process (vLLM v1's split): the scheduler, the model runner and
the recorder run there; HTTP, tokenization, detokenization, stop strings and streaming stay in
the frontend process, so neither waits on the other's interpreter.

Across two pipes, as pickled tuples (commands on a ``multiprocessing`` pipe; outputs as
``engine.server.frames`` messages, which the frontend's event loop reads without blocking):

- frontend -> engine: ``("add", rid, token_ids, params, arrival_s, priority)``, ``("finish", rid,
  reason)`` (the client left: ``aborted``; a stop string: ``stop``), ``("stop",)`` (the grace
  period is over: abort what is left and close the trace);
- engine -> frontend: ``("ready", EngineInfo)`` once, then one ``("out", rids, tokens,
  finishes, errors, stats)`` per engine step (every request's new token of that step, the
  requests that finished, ``StepStats``) and one per batch of inputs that produced errors or
  aborts or ended requests (then with the scheduler's state: ``step_stats.state_stats``), and
  ``("closed", summary, error)`` last.

Stop strings are found in the frontend, which detokenizes anyway (vLLM v1's output processor
does the same): the answer's text is cut exactly at the stop, and the engine hears ``finish(rid,
"stop")`` a step or more after the token that completed it, so the request runs those steps
and its recorded finish (an input like an abort: the trace verifies) comes later than
``LLM.generate``'s, which checks after every step inside its own loop. Where the trace must hold
the offline engine's decisions for the same arrivals (a step-identical comparison with
``LLM.generate``, blocks freed at the stop's step), the check belongs in the core, at the step
boundary; the server does not need that.

``rid`` is the frontend's request id; the engine maps it to its sequence id. Arrival times are
taken by the frontend on the engine's clock (``time.perf_counter`` less the engine's start,
sent in ``EngineInfo``: CLOCK_MONOTONIC is one clock for every process of the machine) as it
sends the ``add``, so the adds come in the order of their arrivals (``engine.server.app``).
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from engine.engine_core import EngineCore, StepResult
from engine.server.engine_loop import abort_all
from engine.server.frames import widen_pipe, write_message
from engine.server.step_stats import TokenClock, state_stats, step_stats

log = logging.getLogger(__name__)

# How long the idle engine waits on the pipe before it looks again (it wakes on any message).
IDLE_WAIT_S = 0.5
# The engine process's OpenMP threads sleep at a barrier instead of spinning (libgomp spins
# ~300,000 times first). Alone in their process the intra-op threads (one a core) spin, and
# the spinning takes the cores the frontend process, the clients and any other load need:
# on a loaded 2-core machine a tiny-model step took 3x as long as in ``--engine thread``,
# where the frontend's own threads share the OpenMP runtime, which then throttles its spin
# (benchmarks/serve_modes.py). Set only where the user set neither variable.
OPENMP_ENVIRONMENT = {"OMP_WAIT_POLICY": "PASSIVE"}
OPENMP_SPIN_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


@dataclass(frozen=True)
class EngineSpec:
    """How the engine process builds its engine (picklable: it crosses to a spawned process).

    ``proxy``: a ``engine.server.proxy.ProxyStepTimes`` to run the real engine core over a
    stand-in executor that takes a GPU's step times (CPU benchmarks of the server); None: the
    model itself (``engine.llm.LLM``).
    """

    model: str | None
    trace_dir: str | None
    overrides: dict[str, Any]
    kv_events_endpoint: str | None = None
    proxy: Any = None
    force: bool = False  # replace a complete trace already in trace_dir (serve --force)

    def build(self, wrap_sink: Any = None) -> Any:
        """The engine (``LLMEngine`` or ``ProxyEngine``): has ``core``, ``config``,
        ``vocab_size``, ``close()``."""
        if self.proxy is not None:
            from engine.server.proxy import ProxyEngine

            return ProxyEngine(self.proxy, self.trace_dir, wrap_sink=wrap_sink,
                               force=self.force, **self.overrides)
        from engine.llm import LLM

        return LLM(self.model, trace_dir=self.trace_dir, record_events=self.trace_dir is not None,
                   force=self.force, trace_writer="serve", wrap_sink=wrap_sink,
                   **self.overrides)


@dataclass(frozen=True)
class EngineInfo:
    """What the frontend needs of a started engine."""

    config: Any  # engine.config.Config, with the KV pool sized
    vocab_size: int
    start_time: float  # the engine clock's zero on time.perf_counter


def engine_main(conn: Connection, outputs: Connection, spec: EngineSpec) -> None:
    """The engine process: build the engine, then drive it with the commands from ``conn``,
    its outputs to ``outputs``, until ``stop`` (or the frontend is gone); the trace is closed
    on the way out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the frontend decides when to stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    publisher = None
    out_fd = outputs.fileno()
    try:
        wrap_sink = None
        if spec.kv_events_endpoint is not None:
            from engine.server.kv_publisher import ZmqKVPublisher
            from tracing.kv_events import KVEventTap

            publisher = ZmqKVPublisher(spec.kv_events_endpoint)

            def wrap_sink(sink: Any) -> Any:
                return KVEventTap(sink, publisher)
        engine = spec.build(wrap_sink)
    except BaseException as exc:  # noqa: BLE001 - the frontend prints it as one line
        write_message(out_fd, ("failed", str(exc) or type(exc).__name__))
        if publisher is not None:
            publisher.close()
        return
    core: EngineCore = engine.core
    write_message(out_fd, ("ready", EngineInfo(engine.config, engine.vocab_size,
                                                core.start_time)))
    inputs = PipeInputs(conn, out_fd, core)
    signal.signal(signal.SIGUSR1, lambda *_: _report(inputs))
    error: str | None = None
    try:
        from engine.drive import drive

        drive(core, inputs, core.now, inputs.wait)
    except BaseException as exc:  # noqa: BLE001 - every waiting client must hear of it
        log.exception("engine loop failed")
        error = str(exc) or type(exc).__name__
    summary = None
    try:
        summary = engine.close()
    except Exception as exc:  # noqa: BLE001 - the trace's error is the user's one line
        error = error or f"closing the engine failed: {exc}"
    if publisher is not None:
        publisher.close()
    try:
        write_message(out_fd, ("closed", summary, error))
    except OSError:
        pass  # the frontend is gone


def _report(inputs: PipeInputs) -> None:
    """SIGUSR1 (the frontend forwards its own): the engine's side of the pipe and its stacks,
    to stderr, for a server that seems stuck."""
    print(f"replayllm engine: {inputs.report()}", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(sys.stderr, all_threads=True)


def _die_with_parent() -> None:
    """Linux: die with the frontend (kill -9 of the server is a crash of the whole server; its
    trace keeps the segments flushed so far). Elsewhere a lost pipe closes the trace."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the frontend died before prctl
        os._exit(1)


class PipeInputs:
    """The engine process's ``Inputs``: commands from the pipe, outputs back once per step."""

    def __init__(self, conn: Connection, out_fd: int, core: EngineCore) -> None:
        self.conn = conn
        self.out_fd = out_fd
        self.core = core
        self.token_clock = TokenClock()  # the inter-token latencies of its steps
        self.rid_of: dict[int, int] = {}  # engine seq_id -> frontend rid, while running
        self.seq_of: dict[int, int] = {}  # frontend rid -> engine seq_id
        self.stopping = False
        self.done = False
        self.counts = PipeCounts("received", "sent")

    def report(self) -> str:
        """One line: messages through the pipe and what the scheduler holds."""
        scheduler = self.core.scheduler
        return (f"{self.counts}; holding {len(self.rid_of)} requests "
                f"({len(scheduler.running)} running, {len(scheduler.waiting)} waiting); "
                f"stopping {self.stopping}")

    def wait(self, due: float) -> None:
        if not self.stopping:
            self.conn.poll(IDLE_WAIT_S)

    def feed(self, core: EngineCore, now: float) -> None:
        """Add and finish what the frontend sent (never blocks)."""
        finishes: list[tuple[int, str]] = []
        errors: list[tuple[int, str]] = []
        ended = False  # a request ended here, between steps: the gauges need its change
        conn = self.conn
        while not self.stopping:
            try:
                if not conn.poll():
                    break
                message = conn.recv()
            except (EOFError, OSError):  # the frontend is gone: abort all, close the trace
                message = ("stop",)
            kind = message[0]
            self.counts.command(kind)
            if kind == "add":
                self._add(core, message, errors)
            elif kind == "finish":
                seq_id = self.seq_of.pop(message[1], None)
                if seq_id is not None:
                    del self.rid_of[seq_id]
                    core.finish(seq_id, message[2])
                    core.forget(seq_id)
                    ended = True
            elif kind == "stop":
                self.stopping = True
        if self.stopping and not self.done:
            finishes.extend((rid, "aborted")
                            for rid in abort_all(core, self.rid_of, self.on_result, now))
            self.seq_of.clear()
            self.done = True
        if finishes or errors or ended:
            self._send([], [], finishes, errors, tuple(state_stats(core)) if ended else None)

    def _add(self, core: EngineCore, message: tuple, errors: list) -> None:
        _, rid, token_ids, params, arrival_s, priority = message
        try:
            seq = core.add_request(token_ids, params, arrival_s=arrival_s, priority=priority)
        except Exception as exc:  # noqa: BLE001 - InvalidRequestError: that request's answer
            errors.append((rid, str(exc)))
            return
        rejection = core.rejections.get(seq.seq_id)
        if rejection is not None:
            core.forget(seq.seq_id)
            errors.append((rid, rejection))
            return
        self.rid_of[seq.seq_id] = rid
        self.seq_of[rid] = seq.seq_id

    def next_due(self) -> float | None:
        return None if self.done else float("inf")

    def on_result(self, result: StepResult, now: float) -> None:
        """One message for the step: each running request's new token, the finished ones."""
        rid_of = self.rid_of
        rids, tokens = [], []
        for seq, token in zip(result.batch.sampled_seqs, result.output.token_ids):
            rid = rid_of.get(seq.seq_id)
            if rid is not None:
                rids.append(rid)
                tokens.append(token)
        finishes = []
        for seq in result.finished:
            rid = rid_of.pop(seq.seq_id, None)
            if rid is not None:
                del self.seq_of[rid]
                finishes.append((rid, seq.finish_reason))
                self.core.forget(seq.seq_id)
        stats = step_stats(self.core, result, self.token_clock)
        self._send(rids, tokens, finishes, [], tuple(stats))

    def _send(self, rids: list, tokens: list, finishes: list, errors: list,
              stats: tuple | None) -> None:
        self.counts.output(tokens, finishes, errors)
        try:
            write_message(self.out_fd, ("out", rids, tokens, finishes, errors, stats))
        except OSError:  # the frontend is gone: the next feed stops
            self.stopping = True


class PipeCounts:
    """The messages through the engine's pipes as one end sees them (for diagnosis: the two
    ends' counts side by side say where a request was lost). ``commands`` / ``outputs``: the
    verb for each direction at this end ("sent" or "received")."""

    def __init__(self, commands: str, outputs: str) -> None:
        self.verbs = commands, outputs
        self.adds = self.finishes = self.outs = self.tokens = self.finished = 0

    def command(self, kind: str) -> None:
        if kind == "add":
            self.adds += 1
        elif kind == "finish":
            self.finishes += 1

    def output(self, tokens: list, finishes: list, errors: list) -> None:
        """An ``out`` message: its tokens, and its finishes and errors (each ends a request)."""
        self.outs += 1
        self.tokens += len(tokens)
        self.finished += len(finishes) + len(errors)

    def __str__(self) -> str:
        commands, outputs = self.verbs
        return (f"{commands} {self.adds} adds and {self.finishes} finishes; {outputs} "
                f"{self.outs} outputs, {self.tokens} tokens, {self.finished} finishes")


@contextmanager
def _engine_environment() -> Iterator[None]:
    """Within the block, the environment a spawned engine process starts with: this one's and
    ``OPENMP_ENVIRONMENT`` (the OpenMP runtime reads it when torch loads, before any of the
    engine's code runs, so it must be in the process's environment from its start)."""
    if any(name in os.environ for name in OPENMP_SPIN_VARIABLES):
        yield
        return
    os.environ.update(OPENMP_ENVIRONMENT)
    try:
        yield
    finally:
        for name in OPENMP_ENVIRONMENT:
            os.environ.pop(name, None)


def spawn_engine(spec: EngineSpec) -> tuple[multiprocessing.process.BaseProcess, Connection,
                                            Connection]:
    """Start the engine process (spawned: no CUDA state is inherited); the frontend's ends of
    its pipes: commands (write) and outputs (read, ``frames`` messages)."""
    context = multiprocessing.get_context("spawn")
    command_reader, command_writer = context.Pipe(duplex=False)
    output_reader, output_writer = context.Pipe(duplex=False)
    widen_pipe(output_writer.fileno())
    widen_pipe(command_writer.fileno())
    process = context.Process(target=engine_main, args=(command_reader, output_writer, spec),
                              name="replayllm-engine", daemon=True)
    with _engine_environment():
        process.start()
    command_reader.close()
    output_writer.close()
    return process, command_writer, output_reader
