"""Start the server: the engine (recording when given a trace directory), its thread, uvicorn."""

from __future__ import annotations

import logging
from typing import Any

from engine.errors import ReplayLLMError

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0


def serve(
    model: str | None,
    trace_dir: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    overrides: dict[str, Any] | None = None,
    served_model_name: str | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    kv_events_endpoint: str | None = None,
) -> dict[str, Any] | None:
    """Serve ``model`` until SIGINT/SIGTERM; returns the engine's summary.

    On a signal the server stops taking connections, gives running requests ``grace_s``
    seconds to finish, aborts the rest (recorded ``aborted``) and closes the trace.
    """
    try:
        import uvicorn

        from engine.server.app import create_app
        from engine.server.engine_loop import EngineLoop
        from engine.server.metrics import ServerMetrics
    except ImportError as exc:
        raise ReplayLLMError(
            f"replayllm serve needs the 'serve' extra (pip install 'replayllm[serve]'): {exc}"
        ) from None
    from engine.llm import LLM

    if grace_s < 0:
        raise ReplayLLMError(f"--grace must be >= 0 seconds, got {grace_s}")
    name = served_model_name or (model if model is not None else "replayllm-tiny")
    publisher = None
    if kv_events_endpoint is not None:
        from engine.server.kv_publisher import ZmqKVPublisher
        from tracing.kv_events import KVEventTap

        publisher = ZmqKVPublisher(kv_events_endpoint)

        def wrap_sink(sink: Any) -> Any:
            return KVEventTap(sink, publisher)
    else:
        wrap_sink = None
    llm = LLM(model, trace_dir=trace_dir, record_events=trace_dir is not None,
              wrap_sink=wrap_sink, **(overrides or {}))
    engine = EngineLoop(llm, ServerMetrics(name))
    app = create_app(engine, name)
    config = uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=grace_s,
                            log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    print(f"replayllm serve: {name} on http://{host}:{port}"
          + (f", recording to {trace_dir}" if trace_dir else ""), flush=True)
    try:
        server.run()
    finally:
        if publisher is not None:
            publisher.close()
    if engine.error is not None:
        raise ReplayLLMError(f"the engine failed: {engine.error}")
    return engine.summary
