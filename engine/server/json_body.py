"""The request body as JSON, and the error a request the server refuses gets (``ApiError``).

``parse_json_body`` takes only what everything after it may take as it is: strict JSON (no
``NaN``, no float past its range), valid Unicode, nested no deeper than the parser's recursion
limit; anything else is a 400. ``engine.server.protocol`` checks the fields.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from engine.sampling_params import is_valid_text


class ApiError(Exception):
    """A request the server refuses: an HTTP status, an OpenAI error object and any headers
    of the answer (a 429's ``Retry-After``)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind
        self.code, self.headers = code, headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


# A ``\\uXXXX`` escape of a UTF-16 surrogate: only these can make ``json.loads`` return a string
# that is not valid Unicode (a lone surrogate, which no UTF-8 encoder takes).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json_body(raw: bytes, interruptible: bool = False) -> dict[str, Any]:
    """The request body as a JSON object: strict JSON (no ``NaN`` or ``Infinity``, no number
    too large for a float) whose strings are valid Unicode, else a 400 (non-UTF-8, malformed
    JSON, a lone surrogate escape, a non-object). Everything later (the tokenizer, the trace's
    Parquet columns) may take the body's strings and numbers as they are.

    ``interruptible``: for a thread beside the event loop. ``json.loads``' C scanner holds the
    interpreter until it returns unless it calls Python code; with this, it calls a Python hook
    for every object and integer (as it does for every float), where the interpreter can switch
    to the loop. Slower (8 MiB of token ids: ~90 ms becomes ~300 ms), the same result."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    # A leading byte order mark (Windows PowerShell's and .NET's UTF-8): RFC 8259 lets a parser
    # ignore it, and vLLM's does (``json.loads`` of the bytes); ``json.loads`` of a str refuses.
    text = text[1:] if text.startswith("\ufeff") else text
    hooks: dict[str, Any] = {"object_hook": _same, "parse_int": _int} if interruptible else {}
    try:
        body = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, **hooks)
    except json.JSONDecodeError as exc:
        raise ApiError(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                       f"column {exc.colno}") from None
    except _NotJson as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300)
        raise ApiError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # ``[[[[...`` past the interpreter's recursion limit: a client's
        raise ApiError("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(text):
        try:
            where = _lone_surrogate(body, "")
        except RecursionError:  # parsed just under the limit, one frame short for the walk
            raise ApiError("the request body is nested too deeply") from None
        if where is not None:
            raise ApiError(f"{where} holds a lone UTF-16 surrogate escape, which is not valid "
                           "Unicode", where.split(".")[0].split("[")[0] or None)
    return body


class _NotJson(ValueError):
    """A number JSON does not have (``NaN``, ``Infinity``, one beyond a float's range)."""


def _same(value: Any) -> Any:
    return value


def _int(literal: str) -> int:
    return int(literal)


def _no_constant(name: str) -> float:
    raise _NotJson(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NotJson(f"the number {literal[:40]} is out of range")
    return value


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The path (``messages[0].content``) of the first string in ``value`` that UTF-8 cannot
    encode, None if there is none."""
    if isinstance(value, str):
        return None if is_valid_text(value) else path or "the request body"
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            found = _lone_surrogate(key, where) or _lone_surrogate(item, where)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None
