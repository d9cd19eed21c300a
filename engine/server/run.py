"""Start the server: the engine (recording when given a trace directory), its thread, uvicorn."""

from __future__ import annotations

import logging
import socket
import sys
from typing import Any

from engine.errors import ReplayLLMError

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0
# After the grace period, how long the aborted streams have to send their last chunks before
# uvicorn cancels what is left.
STREAM_END_S = 5.0


ENGINE_MODES = ("process", "thread")


def _report_on_sigusr1(engine: Any) -> None:
    """SIGUSR1: the frontend's view of its requests and every thread's stack to stderr, and the
    same asked of the engine process (diagnosis of a server that seems stuck)."""
    import faulthandler
    import os
    import signal
    import sys

    def report(*_: Any) -> None:
        line = engine.report() if hasattr(engine, "report") else f"active {engine.num_active}"
        print(f"replayllm serve: {line}", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        process = getattr(engine, "process", None)
        if process is not None and process.pid is not None:
            os.kill(process.pid, signal.SIGUSR1)

    signal.signal(signal.SIGUSR1, report)


class StopRequest:
    """The handler of SIGTERM and SIGINT for the whole of ``serve``, start-up included.

    Once the server exists (``attach``) a signal only asks uvicorn to stop (``should_exit``);
    uvicorn's own handlers, in place while it runs, do the same and then raise the signal again
    under this one. A signal that comes while the engine is still starting (the model loading,
    before ``/health`` answers) is noted: the start-up goes on, and the server then stops at
    once, as after a signal while serving (no request taken, the trace closed complete, the
    summary line, exit 0). Before, Python's default handlers were in place until just before
    ``server.run()``: SIGTERM there killed the server (exit 143, no summary; the engine process
    killed with it, its trace left open) and SIGINT raised ``KeyboardInterrupt`` (exit 130, an
    incomplete trace). A second SIGINT while starting still stops at once
    (``KeyboardInterrupt``), as a second Ctrl-C forces uvicorn's shutdown.
    """

    def __init__(self) -> None:
        self.requested = False
        self.server: Any = None

    def __call__(self, signum: int, frame: Any) -> None:
        import signal

        if self.server is not None:
            self.server.should_exit = True
            return
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def attach(self, server: Any) -> None:
        """From now on a signal stops ``server``; one that came while starting already has."""
        self.server = server
        if self.requested:
            server.should_exit = True


def _stop_cleanly_on_signals(stop: StopRequest) -> dict[int, Any]:
    """SIGTERM and SIGINT go to ``stop`` (``StopRequest``) instead of killing the process:
    installed before the engine starts, so no signal finds Python's default handlers.

    uvicorn handles both signals itself (stop taking connections, the grace period, the
    lifespan's shutdown: the trace closed), then raises the signal again under the handler it
    found. Python's default SIGTERM kills the process there, before ``serve`` returns (no
    summary line, exit status 143, nothing after ``server.run()`` ran: the KV-event publisher of
    a threaded engine left open), and its default SIGINT raised ``KeyboardInterrupt``: exit 130
    and ``interrupted``, the summary lost. Returns the handlers they replaced (empty: none
    replaced, off the main thread).
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}


def _server_class() -> Any:
    import asyncio

    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn's server, whose shutdown has the engine abort what still runs when the grace
        period is over, so that every open stream ends with ``finish_reason`` ``abort`` and
        ``[DONE]`` (a whole answer with ``abort``), each recorded ``aborted``; uvicorn's own
        timeout (``STREAM_END_S`` later) only cancels what is left then. uvicorn alone cut every
        stream mid-body at the grace period (an incomplete chunked read, no error, no
        ``[DONE]``) and logged a traceback for each."""

        def __init__(self, config: Any, stop_engine: Any, grace_s: float) -> None:
            super().__init__(config)
            self.stop_engine, self.grace_s = stop_engine, grace_s

        async def shutdown(self, sockets: Any = None) -> None:
            async def abort_after_grace() -> None:
                await asyncio.sleep(self.grace_s)
                await self.stop_engine(0.0)

            aborter = asyncio.ensure_future(abort_after_grace())
            try:
                await super().shutdown(sockets)
            finally:
                aborter.cancel()

    return GracefulServer


def serve(
    model: str | None,
    trace_dir: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    overrides: dict[str, Any] | None = None,
    served_model_name: str | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    kv_events_endpoint: str | None = None,
    engine_mode: str = "process",
    proxy: Any = None,
    max_request_bytes: int | None = None,
    max_waiting_prompts: int | None = None,
    force: bool = False,
) -> dict[str, Any] | None:
    """Serve ``model`` until SIGINT/SIGTERM; returns the engine's summary.

    ``engine_mode``: ``process`` runs the engine core in its own process (the default: HTTP
    and streaming never take the interpreter from the engine loop), ``thread`` in a thread
    of this one. ``proxy`` (``engine.server.proxy.ProxyStepTimes``): the real engine core over
    a stand-in executor with a GPU's step times, to measure the server on a CPU.
    On SIGTERM or SIGINT the server stops taking connections (a new one is refused), gives
    running requests ``grace_s`` seconds to finish, aborts the rest (recorded ``aborted``; a
    stream ends with ``finish_reason`` ``abort`` and ``[DONE]``), closes the trace (complete)
    and returns: ``replayllm serve`` prints its summary line and exits 0; a signal during the
    start-up stops the server as soon as it has started (``StopRequest``). A request that
    reaches the engine after intake stopped, or that the engine thread (``engine_mode``
    ``thread``) had not taken when the grace period ended, is a 503 with ``Retry-After``. An
    engine that died (its process killed) fails every open request and every new one with a
    503 (a stream, its 200 sent: an error event of that type and ``[DONE]``), ``/health`` says
    503, and the server stops with ``the engine failed``
    (``replayllm serve`` exits 2); its trace keeps the steps flushed so far (incomplete).
    ``max_request_bytes`` (None: from the context) and ``max_waiting_prompts`` (None: the
    default): what a client may make the frontend hold (``engine.server.limits``).
    ``force``: replace a complete trace already in ``trace_dir`` (``--force``).

    The address is bound before the model loads (``_bind``): one taken is one
    ``ReplayLLMError`` at once, with no model loaded and no trace written (uvicorn found it
    only after the start-up, once ``serve`` had said it was serving there, and exited 3,
    leaving an empty complete trace that refused the next ``serve`` of that directory).
    """
    stop = StopRequest()
    previous_handlers = _stop_cleanly_on_signals(stop)  # before the imports and the start-up
    try:
        return _serve(stop, model, trace_dir, host, port, overrides, served_model_name, grace_s,
                      kv_events_endpoint, engine_mode, proxy, max_request_bytes,
                      max_waiting_prompts, force)
    finally:
        import signal

        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)


def _serve(stop: StopRequest, model: str | None, trace_dir: str | None, host: str, port: int,
           overrides: dict[str, Any] | None, served_model_name: str | None, grace_s: float,
           kv_events_endpoint: str | None, engine_mode: str, proxy: Any,
           max_request_bytes: int | None,
           max_waiting_prompts: int | None, force: bool) -> dict[str, Any] | None:
    try:
        import uvicorn

        from engine.server.app import create_app
    except ImportError as exc:
        raise ReplayLLMError(
            f"replayllm serve needs the 'serve' extra (pip install 'replayllm[serve]'): {exc}"
        ) from None
    from engine.server.engine_proc import EngineSpec

    if grace_s < 0:
        raise ReplayLLMError(f"--grace must be >= 0 seconds, got {grace_s}")
    if max_request_bytes is not None and max_request_bytes < 1:
        raise ReplayLLMError(f"--max-request-bytes must be >= 1, got {max_request_bytes}")
    if max_waiting_prompts is not None and max_waiting_prompts < 0:
        raise ReplayLLMError(f"--max-waiting-prompts must be >= 0, got {max_waiting_prompts}")
    if engine_mode not in ENGINE_MODES:
        raise ReplayLLMError(f"--engine must be one of {', '.join(ENGINE_MODES)}, "
                             f"got {engine_mode!r}")
    name = served_model_name or (model if model is not None else "replayllm-tiny")
    spec = EngineSpec(model, trace_dir, dict(overrides or {}), kv_events_endpoint, proxy, force)
    sock = _bind(host, port)
    try:
        engine, publisher = _start_engine(spec, name, engine_mode, kv_events_endpoint)
    except BaseException:
        sock.close()
        raise
    try:
        _report_on_sigusr1(engine)
        limits: dict[str, Any] = {"max_request_bytes": max_request_bytes}
        if max_waiting_prompts is not None:
            limits["max_waiting_prompts"] = max_waiting_prompts
        app = create_app(engine, name, **limits)
        config = uvicorn.Config(app, host=host, port=port,
                                timeout_graceful_shutdown=grace_s + STREAM_END_S,
                                log_level="warning", access_log=False)
        server = _server_class()(config, app.state.server.stop_engine, grace_s)
        stop.attach(server)
        print(f"replayllm serve: {name} on http://{host}:{port} (engine in a {engine_mode})"
              + (f", recording to {trace_dir}" if trace_dir else ""), flush=True)
        if stop.requested:
            print("replayllm serve: a stop signal came while starting: stopping",
                  file=sys.stderr, flush=True)
        server.run(sockets=[sock])
    finally:
        sock.close()
        if publisher is not None:
            publisher.close()
        if engine_mode == "process" and engine.summary is None:
            engine.shutdown(0.0)  # uvicorn never ran the lifespan (e.g. the port was taken)
    if engine.error is not None:
        raise ReplayLLMError(f"the engine failed: {engine.error}")
    return engine.summary


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` for uvicorn to listen on (as uvicorn binds one: IPv6
    where the host has a colon, ``SO_REUSEADDR``); a ``ReplayLLMError`` naming the address
    where it cannot be bound (taken, or not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ReplayLLMError(f"cannot listen on {host}:{port}: "
                             f"{exc.strerror or exc} (--host, --port)") from None
    return sock


def _start_engine(spec: Any, name: str, engine_mode: str,
                  kv_events_endpoint: str | None) -> tuple[Any, Any]:
    """The started engine (``EngineProcess`` or ``EngineLoop``) and the KV-event publisher of a
    threaded engine (None otherwise)."""
    from engine.server.metrics import ServerMetrics

    if engine_mode == "process":
        from engine.server.engine_client import EngineProcess

        return EngineProcess(spec, ServerMetrics(name)), None
    from engine.server.engine_loop import EngineLoop

    publisher = wrap_sink = None
    if kv_events_endpoint is not None:
        from engine.server.kv_publisher import ZmqKVPublisher
        from tracing.kv_events import KVEventTap

        publisher = ZmqKVPublisher(kv_events_endpoint)

        def wrap_sink(sink: Any) -> Any:
            return KVEventTap(sink, publisher)
    try:
        return EngineLoop(spec.build(wrap_sink), ServerMetrics(name)), publisher
    except BaseException:
        if publisher is not None:
            publisher.close()
        raise
