"""Start the server: the engine (recording when given a trace directory), its thread, uvicorn."""

from __future__ import annotations

import logging
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


def _stop_cleanly_on_signals(server: Any) -> dict[int, Any]:
    """SIGTERM and SIGINT only ask uvicorn to stop; the process then exits normally.

    uvicorn handles both signals itself (stop taking connections, the grace period, the
    lifespan's shutdown: the trace closed), then raises the signal again under the handler it
    found. Python's default SIGTERM kills the process there, before ``serve`` returns (no
    summary line, exit status 143, nothing after ``server.run()`` ran: the KV-event publisher of
    a threaded engine left open), and its default SIGINT raised ``KeyboardInterrupt``: exit 130
    and ``interrupted``, the summary lost. These handlers, in place before uvicorn's, only ask
    uvicorn to stop: also for a signal that comes just before uvicorn took it. Returns the
    handlers they replaced (empty: none replaced, off the main thread).
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(*_: Any) -> None:
        server.should_exit = True

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
) -> dict[str, Any] | None:
    """Serve ``model`` until SIGINT/SIGTERM; returns the engine's summary.

    ``engine_mode``: ``process`` runs the engine core in its own process (the default: HTTP
    and streaming never take the interpreter from the engine loop), ``thread`` in a thread
    of this one. ``proxy`` (``engine.server.proxy.ProxyStepTimes``): the real engine core over
    a stand-in executor with a GPU's step times, to measure the server on a CPU.
    On SIGTERM or SIGINT the server stops taking connections (a new one is refused), gives
    running requests ``grace_s`` seconds to finish, aborts the rest (recorded ``aborted``; a
    stream ends with ``finish_reason`` ``abort`` and ``[DONE]``), closes the trace (complete)
    and returns: ``replayllm serve`` prints its summary line and exits 0. A request that
    reaches the engine after intake stopped is a 503 with ``Retry-After``. An engine that died
    (its process killed) fails every open request with an error event or a 500 and every new
    one with a 503, ``/health`` says 503, and the server stops with ``the engine failed``
    (``replayllm serve`` exits 2); its trace keeps the steps flushed so far (incomplete).
    ``max_request_bytes`` (None: from the context) and ``max_waiting_prompts`` (None: the
    default): what a client may make the frontend hold (``engine.server.limits``).
    """
    try:
        import uvicorn

        from engine.server.app import create_app
        from engine.server.metrics import ServerMetrics
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
    spec = EngineSpec(model, trace_dir, dict(overrides or {}), kv_events_endpoint, proxy)
    publisher = None
    if engine_mode == "process":
        from engine.server.engine_client import EngineProcess

        engine: Any = EngineProcess(spec, ServerMetrics(name))
    else:
        from engine.server.engine_loop import EngineLoop

        wrap_sink = None
        if kv_events_endpoint is not None:
            from engine.server.kv_publisher import ZmqKVPublisher
            from tracing.kv_events import KVEventTap

            publisher = ZmqKVPublisher(kv_events_endpoint)

            def wrap_sink(sink: Any) -> Any:
                return KVEventTap(sink, publisher)
        engine = EngineLoop(spec.build(wrap_sink), ServerMetrics(name))
    _report_on_sigusr1(engine)
    limits: dict[str, Any] = {"max_request_bytes": max_request_bytes}
    if max_waiting_prompts is not None:
        limits["max_waiting_prompts"] = max_waiting_prompts
    app = create_app(engine, name, **limits)
    config = uvicorn.Config(app, host=host, port=port,
                            timeout_graceful_shutdown=grace_s + STREAM_END_S,
                            log_level="warning", access_log=False)
    server = _server_class()(config, app.state.server.stop_engine, grace_s)
    previous_handlers = _stop_cleanly_on_signals(server)
    print(f"replayllm serve: {name} on http://{host}:{port} (engine in a {engine_mode})"
          + (f", recording to {trace_dir}" if trace_dir else ""), flush=True)
    try:
        server.run()
    finally:
        import signal

        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        if publisher is not None:
            publisher.close()
        if engine_mode == "process" and engine.summary is None:
            engine.shutdown(0.0)  # uvicorn never ran the lifespan (e.g. the port was taken)
    if engine.error is not None:
        raise ReplayLLMError(f"the engine failed: {engine.error}")
    return engine.summary
