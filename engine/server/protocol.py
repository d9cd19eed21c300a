"""OpenAI request bodies: what ``/v1/completions`` and ``/v1/chat/completions`` accept.

Each body is checked field by field; anything this server cannot honour (``n`` > 1, logprobs,
tools, an unknown field, a wrong type) is an ``ApiError`` naming the field, which the app
returns as an OpenAI-style 400. Nothing here touches the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.errors import InvalidRequestError
from engine.sampling_params import INT32_MAX, INT32_MIN, SamplingParams, as_recorded

# ``ApiError`` and ``parse_json_body`` live with the JSON reading; the routes take them from here.
from engine.server.json_body import ApiError, parse_json_body  # noqa: F401

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4  # OpenAI's limit


@dataclass
class ParsedRequest:
    """A checked request: the prompt (text, token ids or chat messages) and sampling settings.

    ``max_tokens`` None: as many as the context allows (chat's default), set by the app;
    ``max_tokens_param``: the field the client set it with (None: a default).
    """

    chat: bool
    model: str | None
    prompt: str | list[int] | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    max_tokens: int | None = None
    max_tokens_param: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # every chunk carries the usage so far (vLLM's option)
    priority: int = 0  # vLLM's extension: lower is served first under policy=priority

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        try:
            return SamplingParams(temperature=self.temperature, max_tokens=max_tokens,
                                  ignore_eos=self.ignore_eos, top_p=self.top_p, top_k=self.top_k,
                                  seed=self.seed, stop=self.stop)
        except InvalidRequestError as exc:  # checked above: a field the parser let through
            raise ApiError(str(exc)) from None


# Fields both endpoints accept (with the values they may take where that is limited).
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
           "stream_options", "n", "user", "ignore_eos", "presence_penalty", "frequency_penalty",
           "logit_bias", "logprobs", "best_of", "priority"}
# Bookkeeping that changes nothing in an answer (OpenAI's stored completions, tags, the
# billing tier, its cache and abuse keys): accepted and ignored, as vLLM does, since clients
# and frameworks send them by default.
_BOOKKEEPING = {"store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier"}
_COMMON |= _BOOKKEEPING
_COMPLETION_ONLY = {"prompt", "echo", "suffix"}
_CHAT_ONLY = {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
              "response_format", "parallel_tool_calls", "modalities"}


# A chat message's fields; and those an assistant message the ``openai`` library returned
# carries, taken while empty (they then say nothing): clients send such messages back.
# ``name`` (the speaker) and ``reasoning_content`` (an assistant turn's thinking, which the
# Qwen3 template renders or strips) reach the template as vLLM passes them.
TEMPLATE_STRING_FIELDS = ("name", "reasoning_content")
_MESSAGE_FIELDS = {"role", "content", *TEMPLATE_STRING_FIELDS}
_EMPTY_MESSAGE_FIELDS = {"tool_calls", "function_call", "refusal", "audio", "annotations"}


def parse_completion(body: dict[str, Any]) -> ParsedRequest:
    """A ``/v1/completions`` body."""
    _no_unknown(body, _COMMON | _COMPLETION_ONLY)
    body = whole_numbers(body)
    request = ParsedRequest(chat=False, model=_model(body))
    request.prompt = _prompt(body)
    if body.get("echo"):
        raise ApiError("echo is not supported", "echo")
    if body.get("suffix") is not None:
        raise ApiError("suffix is not supported", "suffix")
    if body.get("logprobs") is not None:
        raise ApiError("logprobs is not supported", "logprobs")
    _common(body, request)
    _max_tokens(body, request, "max_tokens")
    if request.max_tokens is None:
        request.max_tokens = DEFAULT_COMPLETION_MAX_TOKENS
    return request


def parse_chat(body: dict[str, Any]) -> ParsedRequest:
    """A ``/v1/chat/completions`` body."""
    _no_unknown(body, _COMMON | _CHAT_ONLY)
    body = whole_numbers(body)
    request = ParsedRequest(chat=True, model=_model(body))
    request.messages = _messages(body)
    if body.get("logprobs") not in (None, False):
        raise ApiError("logprobs is not supported", "logprobs")
    # 0 asks for none (vLLM serves it, refusing only a positive one without logprobs).
    top_logprobs = body.get("top_logprobs")
    if top_logprobs is not None and (not _is_int(top_logprobs) or top_logprobs != 0):
        raise ApiError("top_logprobs is not supported (only 0)", "top_logprobs")
    if body.get("tools"):
        raise ApiError("tools are not supported", "tools")
    if body.get("tool_choice") not in (None, "none"):
        raise ApiError("tool_choice is not supported", "tool_choice")
    if body.get("modalities") not in (None, ["text"]):
        raise ApiError("only modalities [\"text\"] are supported", "modalities")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise ApiError("only response_format {\"type\": \"text\"} is supported",
                       "response_format")
    _common(body, request)
    # Both checked; OpenAI's newer max_completion_tokens is the limit when both are set.
    _max_tokens(body, request, "max_tokens")
    _max_tokens(body, request, "max_completion_tokens")
    return request


# The integer fields of either endpoint (and ``prompt``'s token ids: ``_prompt``).
INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "best_of", "top_k", "seed", "priority",
              "top_logprobs")


def whole_numbers(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with each integer field written as a whole float (``5.0``, ``1e3``) as that int:
    JSON has one number type, clients that compute a field (JavaScript, a float division) send
    ``5.0``, and vLLM takes it (pydantic's lax mode; ``5.5`` it refuses). A float with a fraction
    in such a field is a 400 naming it; any other type is left for the field's own check (a
    bool, a string: refused there). ``body`` itself is not changed."""
    changed: dict[str, Any] = {}
    for name in INT_FIELDS:
        value = body.get(name)
        if isinstance(value, float):
            changed[name] = _whole(value, name)
    return {**body, **changed} if changed else body


def _whole(value: float, name: str) -> int:
    if not value.is_integer():  # never inf or nan: ``parse_json_body`` refuses those
        raise ApiError(f"{name} must be an integer, got {value!r}", name)
    return int(value)


def _no_unknown(body: dict[str, Any], known: set[str]) -> None:
    for name in body:
        if name not in known:
            raise ApiError(f"unsupported field {name!r}", name)


def _model(body: dict[str, Any]) -> str | None:
    """The model asked for; None (the served one) where the field is absent, null or empty: an
    empty name is vLLM's default model too (its ``check_model``: ``if not model_name``), and
    clients send one where the user configured none."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError("model must be a string", "model")
    return model or None


def _prompt(body: dict[str, Any]) -> str | list[int]:
    if "prompt" not in body:
        raise ApiError("the prompt field is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and any(isinstance(t, float) for t in prompt):
        prompt = [_whole(t, "prompt") if isinstance(t, float) else t for t in prompt]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError("only one prompt per request is supported (a string or a list of token "
                       "ids)", "prompt")
    raise ApiError("prompt must be a string or a list of token ids", "prompt")


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if messages is None:
        raise ApiError("the messages field is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ApiError(f"messages[{i}] must be an object", "messages")
        role, content = message.get("role"), message.get("content")
        if role not in ("system", "user", "assistant", "developer"):
            raise ApiError(f"messages[{i}].role {role!r} is not supported", "messages")
        if message.get("tool_calls") or message.get("function_call"):
            raise ApiError(f"messages[{i}]: tool calls are not supported", "messages")
        for key, value in message.items():  # else dropped unseen, though a template may use it
            if key not in _MESSAGE_FIELDS and not (key in _EMPTY_MESSAGE_FIELDS and not value):
                raise ApiError(f"messages[{i}]: unsupported field {key!r}", "messages")
        for key in TEMPLATE_STRING_FIELDS:
            if message.get(key) is not None and not isinstance(message[key], str):
                raise ApiError(f"messages[{i}].{key} must be a string", "messages")
        if role == "assistant" and content is None:  # OpenAI: optional for the assistant
            content = ""
        if isinstance(content, list):  # content parts: text only
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise ApiError(f"messages[{i}].content: only text parts are supported",
                                   "messages")
                if not isinstance(part.get("text"), str):
                    raise ApiError(f"messages[{i}].content[{j}].text must be a string",
                                   "messages")
                texts.append(part["text"])
            content = "\n".join(texts)  # as vLLM joins them
        if not isinstance(content, str):
            raise ApiError(f"messages[{i}].content must be a string", "messages")
        turn = {"role": "system" if role == "developer" else role, "content": content}
        turn.update({key: message[key] for key in TEMPLATE_STRING_FIELDS
                     if message.get(key) is not None})  # the template's to use
        out.append(turn)
    return out


def _max_tokens(body: dict[str, Any], request: ParsedRequest, name: str) -> None:
    """The answer's length limit from field ``name``, if the client set it."""
    value = body.get(name)
    if value is None:
        return
    if not _is_int(value) or value < 1:
        raise ApiError(f"{name} must be an integer >= 1, got {value!r}", name)
    request.max_tokens, request.max_tokens_param = value, name


def _common(body: dict[str, Any], request: ParsedRequest) -> None:
    """The fields both endpoints share."""
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise ApiError(f"n must be 1 (one choice per request), got {n!r}", "n")
    best_of = body.get("best_of")
    if best_of is not None and (not _is_int(best_of) or best_of != 1):
        raise ApiError(f"best_of must be 1, got {best_of!r}", "best_of")
    for penalty in ("presence_penalty", "frequency_penalty"):
        value = body.get(penalty)
        if value is not None and (not _is_number(value) or value != 0):
            raise ApiError(f"{penalty} is not supported (only 0)", penalty)
    if body.get("logit_bias"):
        raise ApiError("logit_bias is not supported", "logit_bias")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ApiError("user must be a string", "user")
    request.temperature = _as_recorded(_number(body, "temperature", 1.0, low=0.0),
                                       "temperature")
    request.top_p = _as_recorded(_number(body, "top_p", 1.0, low=0.0, high=1.0, low_open=True),
                                 "top_p")
    top_k = body.get("top_k")
    if top_k is not None:
        if not _is_int(top_k) or not -1 <= top_k <= INT32_MAX:
            raise ApiError(f"top_k must be an integer in [-1, {INT32_MAX}] (-1 or 0: off), "
                           f"got {top_k!r}", "top_k")
        request.top_k = max(top_k, 0)
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed) or not 0 <= seed < 2**63:
            raise ApiError(f"seed must be an integer in [0, 2**63), got {seed!r}", "seed")
        request.seed = seed
    priority = body.get("priority")
    if priority is not None:  # the trace's int32 column (``check_recordable``'s bounds)
        if not _is_int(priority) or not INT32_MIN <= priority <= INT32_MAX:
            raise ApiError(f"priority must be an integer in [{INT32_MIN}, {INT32_MAX}], got "
                           f"{priority!r}", "priority")
        request.priority = priority
    request.stop = _stop(body.get("stop"))
    request.ignore_eos = _bool(body, "ignore_eos", False)
    request.stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage",
                                                            "continuous_usage_stats"}:
            raise ApiError("stream_options may only hold include_usage and "
                           "continuous_usage_stats", "stream_options")
        if not request.stream:
            raise ApiError("stream_options needs stream: true", "stream_options")
        for name in ("include_usage", "continuous_usage_stats"):
            if not isinstance(options.get(name, False), bool):
                raise ApiError(f"stream_options.{name} must be true or false", "stream_options")
        # Absent from the options (``{}``): no usage chunk. OpenAI's reference documents the
        # field with no default ("If set, an additional chunk will be streamed"); vLLM's
        # ``StreamOptions`` defaults it to true, so ``{}`` gets usage there. OpenAI's rule.
        request.include_usage = options.get("include_usage", False)
        request.continuous_usage = request.include_usage and options.get(
            "continuous_usage_stats", False)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ApiError("stop must be a string or a list of strings", "stop")
    if len(value) > MAX_STOP_STRINGS:
        raise ApiError(f"at most {MAX_STOP_STRINGS} stop strings", "stop")
    return tuple(s for s in value if s)


def _number(body: dict[str, Any], name: str, default: float, low: float,
            high: float | None = None, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value):
        raise ApiError(f"{name} must be a number, got {value!r}", name)
    if value < low or (low_open and value == low) or (high is not None and value > high):
        bounds = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
        raise ApiError(f"{name} must be in {bounds}, got {value}", name)
    return float(value)


def _as_recorded(value: float, name: str) -> float:
    """``value`` as the trace records it (``sampling_params.as_recorded``), a 400 naming the
    field where it cannot."""
    try:
        return as_recorded(value, name)
    except InvalidRequestError as exc:
        raise ApiError(str(exc), name) from None


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(f"{name} must be true or false", name)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
