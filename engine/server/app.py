"""The OpenAI-compatible HTTP frontend (FastAPI): completions, chat completions, models,
health and Prometheus metrics, over the engine: an ``EngineProcess`` (the engine core in its
own process, the default) or an ``EngineLoop`` (in a thread of this process).

Requests are checked (``engine.server.protocol``) and tokenized here; anything the engine could
not serve is a 400 before it reaches the engine, so the trace holds real traffic only.

A long prompt is tokenized off the event loop (``engine.server.prompt``), so the order in which
requests reach the engine is the order their prompts are ready, not the order they came in: a
small request sent while a multi-MB prompt tokenizes goes to the engine first and streams at
once, rather than waiting seconds behind it. The arrival the engine gets (``arrival_s``, what
the trace records) is the moment the request is handed to it: stamped on the event loop thread
immediately before ``submit`` (nothing awaited between), so the engine sees arrivals in
nondecreasing order, in its own order of adds; a request's ``seq_id`` order is its arrival
order, and the what-if, which feeds a recording's requests by ``arrival_s``, feeds them in the
order the engine took them, each when the engine could first have taken it. The time a request
spent in the frontend (its body, parsing, tokenizing) is not in the trace's latencies; the
server's own latency metrics (``/metrics``) and the client's count from its receipt.

What a client can make the frontend hold is bounded (``engine.server.limits``): a body over
``max_request_bytes`` is a 413 before it is all read, one over 64 KiB is parsed in a thread
(``BodyParser``); a long prompt finding the tokenizing pool full is a 429 with a
``Retry-After``. A client that leaves while its prompt is in the pool is never submitted: the
engine and the trace never see it.

A request that meets a stopped engine (shutting down, or its process dead) is a 503
``service_unavailable`` with a ``Retry-After`` wherever it meets it: refused by ``submit``, or
failed by the engine after it (``EngineStopped`` on its stream); a stream, its 200 already
sent, ends with an error event of that type and ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from engine.server import generation as gen
from engine.server.engine_loop import EngineStopped, RequestStream
from engine.server.limits import BodyParser, default_max_request_bytes, read_body
from engine.server.metrics import CONTENT_TYPE, ServerMetrics
from engine.server.prompt import MAX_WAITING_PROMPTS, ClientLeft, PromptPreparer
from engine.server.protocol import (
    ApiError,
    ParsedRequest,
    parse_chat,
    parse_completion,
)

# Seconds the engine thread gets, after the HTTP server stopped, to abort what is left.
ENGINE_STOP_GRACE_S = 5.0
# The Retry-After (seconds) of a request refused because the server is shutting down.
SHUTDOWN_RETRY_AFTER_S = 1


class EngineStopper:
    """Stops the engine once (``engine.shutdown`` in a thread), for whoever asks first: the
    server when the grace period is over (``engine.server.run``: the engine aborts what is left,
    so every stream ends with ``finish_reason`` ``abort`` and ``[DONE]`` before the HTTP server
    gives up on its connections) or the app's lifespan at shutdown. Each call awaits the same
    stop."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._future: asyncio.Future | None = None

    def __call__(self, grace_s: float) -> asyncio.Future:
        if self._future is None:
            self._future = asyncio.get_running_loop().run_in_executor(
                None, self.engine.shutdown, grace_s)
        return self._future


@dataclass
class ServerState:
    """What the routes share: the engine loop, the tokenizer, the prompt tokenizer's pool and
    the served model's limits; ``max_request_bytes``: the largest body taken."""

    engine: Any  # EngineProcess or EngineLoop
    tokenizer: Any
    model_name: str
    max_model_len: int
    vocab_size: int
    metrics: ServerMetrics
    created: int
    prompts: PromptPreparer
    max_request_bytes: int
    bodies: BodyParser
    stop_engine: EngineStopper


def create_app(engine: Any, model_name: str, max_request_bytes: int | None = None,
               max_waiting_prompts: int = MAX_WAITING_PROMPTS) -> FastAPI:
    """The app over a started engine (``EngineProcess`` or ``EngineLoop``); its lifespan
    connects the engine's outputs to the event loop and, at shutdown, stops the engine and
    closes the trace. ``max_request_bytes``: the body limit (None: from the context,
    ``default_max_request_bytes``); ``max_waiting_prompts``: long prompts that may wait for
    the tokenizing pool."""
    metrics = engine.metrics if engine.metrics is not None else ServerMetrics(model_name)
    engine.set_metrics(metrics)
    prompts = PromptPreparer(engine.tokenizer, engine.max_model_len, engine.vocab_size,
                             max_waiting=max_waiting_prompts)
    metrics.watch_prompt_pool(lambda: prompts.in_pool, lambda: prompts.in_pool_chars)
    if max_request_bytes is None:
        max_request_bytes = default_max_request_bytes(engine.max_model_len)
    state = ServerState(engine, engine.tokenizer, model_name, engine.max_model_len,
                        engine.vocab_size, metrics, int(time.time()), prompts,
                        max_request_bytes, BodyParser(), EngineStopper(engine))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            prompts.close()
            state.bodies.close()
            await state.stop_engine(ENGINE_STOP_GRACE_S)

    app = FastAPI(title="replayllm", lifespan=lifespan)
    app.state.server = state

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    # Every error is an OpenAI error object, whatever raised it: an unknown path or method
    # (Starlette's HTTPException) and a bug of ours (a 500 the client can still parse).
    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        error = ApiError(f"{exc.detail}: {request.method} {request.url.path}",
                         status=exc.status_code, kind=kind)
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette raises ``exc`` again after this answer: uvicorn logs its traceback.
        error = ApiError(f"internal server error: {type(exc).__name__}: {exc}", status=500,
                         kind="server_error")
        return JSONResponse(error.body(), status_code=500)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.healthy else 503)

    def model_card() -> dict[str, Any]:
        return {"id": model_name, "object": "model", "created": state.created,
                "owned_by": "replayllm", "max_model_len": state.max_model_len}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        _check_model(state, model_id, None)
        return model_card()

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(state, request, parse_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(state, request, parse_chat)

    return app


async def _parsed(state: ServerState, request: Request,
                  check: Callable[[dict[str, Any]], ParsedRequest]) -> ParsedRequest:
    """The request's body, read within the limit, parsed and checked (a large one off the
    loop: ``BodyParser``). A body that is not JSON, sent as another type (a form, text), is a
    400 that names the type sent and the one to send; a JSON body is taken under any type
    (``curl -d`` declares a form)."""
    raw = await read_body(request, state.max_request_bytes)
    try:
        return await state.bodies.parse(raw, check)
    except ApiError as exc:
        declared = request.headers.get("content-type", "")
        media = declared.split(";")[0].strip().lower()
        if exc.param is None and exc.message.startswith("the request body") and media and \
                media != "application/json" and not media.endswith("+json"):
            raise ApiError(f"{exc.message} (the request's Content-Type is {media}; send a JSON "
                           "body with Content-Type: application/json)") from None
        raise


def _admit(state: ServerState, parsed: ParsedRequest, ids: list[int],
           field: str) -> RequestStream:
    """A request with its prompt's token ids ready for the engine (ApiError: what is wrong with
    it); its arrival is set as it is submitted."""
    limit = state.max_model_len
    max_tokens = parsed.max_tokens if parsed.max_tokens is not None else limit - len(ids)
    if len(ids) + max_tokens > limit:
        if parsed.max_tokens_param is not None and len(ids) < limit:
            field = parsed.max_tokens_param  # the prompt fits: what the client asked for not
        raise ApiError(
            f"this model's maximum context length is {limit} tokens; the request has "
            f"{len(ids)} prompt tokens and asks for {max_tokens} more (at most "
            f"{limit - len(ids)})", field, code="context_length_exceeded")
    params = parsed.sampling_params(max_tokens)
    error = state.engine.admission_error(ids, params)
    if error is not None:  # more than the engine's KV pool could ever hold
        if state.engine.admission_error(ids, parsed.sampling_params(1)) is not None:
            raise ApiError(error, field)  # the prompt alone does not fit
        if parsed.max_tokens_param is not None:
            raise ApiError(error, parsed.max_tokens_param)
        # A default (chat's: the rest of the context): the longest answer the pool can hold.
        params = parsed.sampling_params(_longest_answer(state, ids, parsed, max_tokens))
    return RequestStream(ids, params, float("nan"), priority=parsed.priority)


def _longest_answer(state: ServerState, ids: list[int], parsed: ParsedRequest,
                    refused: int) -> int:
    """The largest ``max_tokens`` below ``refused`` the engine admits for prompt ``ids``
    (1 is admitted), by bisection over its own rule (``admission_error``, which grows with
    ``max_tokens``), so the frontend keeps no copy of the pool's arithmetic."""
    low, high = 1, refused  # admitted, refused
    while high - low > 1:
        middle = (low + high) // 2
        if state.engine.admission_error(ids, parsed.sampling_params(middle)) is None:
            low = middle
        else:
            high = middle
    return low


def _check_model(state: ServerState, name: str, param: str | None) -> None:
    """OpenAI's answer to a model it does not serve: a 404 ``model_not_found``."""
    if name != state.model_name:
        raise ApiError(f"the model {name!r} does not exist; this server serves "
                       f"{state.model_name!r}", param, status=404, code="model_not_found")


async def _serve(state: ServerState, request: Request,
                 check: Callable[[dict[str, Any]], ParsedRequest]) -> Response:
    """Read and ``check`` the body, tokenize, check and submit the request, then answer it. The
    server's latency metrics start as it comes in. A client that leaves before its request is
    submitted (while its body arrives, or its long prompt waits or tokenizes) gets a 499 and
    never reaches the engine."""
    received = time.perf_counter()
    try:
        parsed = await _parsed(state, request, check)
        if parsed.model is not None:
            _check_model(state, parsed.model, "model")
        # A long prompt: off the event loop, dropped if the client leaves meanwhile.
        ids, field = await state.prompts.token_ids(parsed, lambda: _disconnected(request))
    except ClientLeft:
        return Response(status_code=499)
    stream = _admit(state, parsed, ids, field)
    # Its arrival, on the engine's clock: now, as it is handed over, with nothing awaited
    # between the two, so the engine's adds come in the order of their arrivals.
    stream.arrival_s = state.engine.now()
    try:
        state.engine.submit(stream)
    except EngineStopped as exc:
        raise _unavailable(exc) from None
    generation = gen.Generation(state.engine, stream, state.tokenizer, state.metrics, received)
    request_id, created = gen.new_id(parsed.chat), int(time.time())
    if parsed.stream:
        return _EventStream(_events(state, parsed, generation, request_id, created),
                            generation)
    try:
        return await _whole(state, request, parsed, generation, request_id, created)
    finally:
        generation.close()


def _unavailable(exc: EngineStopped) -> ApiError:
    """The answer to a request that met a stopped engine, wherever it met it (``submit``
    refused it; or the engine, its process dead or the grace period over, never finished it):
    a 503 ``service_unavailable``, come back (to the next server) later."""
    return ApiError(str(exc), status=503, kind="service_unavailable",
                    headers={"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)})


class _EventStream(StreamingResponse):
    """A streamed answer that aborts its request once the response ends, however it ends:
    also when the client left before the first chunk (Starlette then cancels the response
    before the body's generator ever ran, so no ``finally`` of it would)."""

    def __init__(self, events: AsyncIterator[str], generation: gen.Generation) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.generation = generation

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.generation.close()


async def _whole(state: ServerState, request: Request, parsed: ParsedRequest,
                 generation: gen.Generation, request_id: str, created: int) -> Response:
    """Wait for the whole answer, aborting it if the client disconnects meanwhile."""
    async def collect() -> tuple[str, str | None]:
        texts, reason = [], None
        async for piece in generation.pieces():
            texts.append(piece.text)
            reason = piece.finish_reason
        return "".join(texts), reason

    answer = asyncio.ensure_future(collect())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler was cancelled (a shutdown past its grace period)
        gone.cancel()
        answer.cancel()  # Generation.pieces aborts the request
        raise
    gone.cancel()
    if not answer.done():
        answer.cancel()  # the client left: Generation.pieces aborts the request
        await asyncio.gather(answer, return_exceptions=True)
        return Response(status_code=499)
    try:
        text, reason = answer.result()
    except EngineStopped as exc:  # it stopped after taking the request: as if before
        raise _unavailable(exc) from None
    except gen.GenerationError as exc:
        raise ApiError(str(exc), status=500, kind="server_error") from None
    return JSONResponse(gen.full_response(parsed.chat, request_id, state.model_name, created,
                                          text, reason, generation.usage()))


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _events(state: ServerState, parsed: ParsedRequest, generation: gen.Generation,
                  request_id: str, created: int) -> AsyncIterator[str]:
    """The server-sent events of a streamed answer. Starlette cancels this generator when the
    client disconnects; ``Generation.pieces`` then aborts the request."""
    chat, model, usage = parsed.chat, state.model_name, parsed.include_usage
    writer = gen.ChunkWriter(chat, request_id, model, created, usage)

    def so_far() -> dict[str, int] | None:  # continuous_usage_stats: each chunk's usage
        return generation.usage() if parsed.continuous_usage else None

    def content(text: str) -> str:
        if parsed.continuous_usage:
            return gen.chunk(chat, request_id, model, created, text, None, usage,
                             usage=so_far())
        return writer.piece(text)

    if chat:
        yield gen.chunk(chat, request_id, model, created, "", None, usage, first=True,
                        usage=so_far())
    try:
        async for piece in generation.pieces():
            if piece.text or piece.finish_reason is None:
                yield content(piece.text)
            if piece.finish_reason is not None:
                text = None if chat else ""
                yield gen.chunk(chat, request_id, model, created, text, piece.finish_reason,
                                usage, usage=so_far())
    except EngineStopped as exc:  # the 200 is sent: the whole answer's 503 as the last event
        yield gen.sse(_unavailable(exc).body())
        yield gen.DONE
        return
    except gen.GenerationError as exc:
        yield gen.sse(ApiError(str(exc), status=500, kind="server_error").body())
        yield gen.DONE
        return
    if usage:
        yield gen.usage_chunk(chat, request_id, model, created, generation.usage())
    yield gen.DONE
