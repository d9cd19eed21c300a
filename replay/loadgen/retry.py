"""When to send a refused request again: HTTP 429 (too many requests) and 503 (unavailable)
are a server asking the client to come back later, 502 and 504 a gateway in front of it that
could not reach it, not a failed request; so is a request that provably never reached the
server (``never_reached``: no connection, or the request not written whole). A connection lost
once the request was written, before any answer, is not: the server may have taken the request
and be generating its answer, and sending it again would run it twice and count it twice; nor
is one lost mid-stream (a partial answer is not asked for twice). The wait is the answer's
``Retry-After`` (seconds, or an HTTP date), else an exponential backoff with jitter (so that
requests refused together do not all come back in the same instant), capped. The jitter is
drawn from each request's own generator (``retry_rng``): a run with the same seed waits the
same, whatever order requests are refused in."""

from __future__ import annotations

import email.utils
import math
import random
import time
from datetime import timezone

import aiohttp

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Backoff without Retry-After: BASE * 2**k seconds before retry k + 1, at most CAP, each drawn
# from its upper half (jitter that keeps the wait from shrinking to nothing).
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
# aiohttp's message for a failure writing the request body (a ``ClientOSError``, no class of its
# own; the same from 3.9 to 3.14).
BODY_NOT_WRITTEN = "Can not write request body"
# Why a connection lost before any answer is not retried (in the request's error).
SENT_WHOLE = "not sent again: the request was sent whole, the server may have taken it"


def never_reached(exc: BaseException) -> bool:
    """Whether a POST that failed with ``exc`` before any answer provably never reached the
    server as a request, so that sending it again cannot run it twice: no connection was made
    (``ClientConnectorError``: refused, unreachable, a name not resolved, a proxy's refusal), or
    the request was not written whole (a ``ClientConnectionResetError``: writing to a
    connection already closed; the ``ClientOSError`` of a body write that failed): a server
    runs no request short of its ``Content-Length``. A connection closed or reset once the
    request was written (``ServerDisconnectedError``, a ``ClientOSError`` reading the answer)
    proves nothing: the server may have taken it (False). A TLS failure is not asked here
    (``client._attempt`` lets it through)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return True
    reset = getattr(aiohttp, "ClientConnectionResetError", ())  # aiohttp >= 3.10
    if reset and isinstance(exc, reset):
        return True
    return isinstance(exc, aiohttp.ClientOSError) and BODY_NOT_WRITTEN in str(exc)


def retry_after_s(header: str | None, now: float | None = None) -> float | None:
    """The wait a ``Retry-After`` header asks for, in seconds (0 for a date already past);
    None where there is none or it is neither a number of seconds nor an HTTP date.
    ``now``: the wall clock (``time.time()``) a date is measured from."""
    if header is None or not (text := header.strip()):
        return None
    try:
        seconds = float(text)  # the spec's is an integer: a decimal one is taken as meant
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" parses without a zone; an HTTP date is always GMT
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_rng(seed: int | None, index: int) -> random.Random:
    """Request ``index``'s jitter generator: from ``seed`` and the index alone (None: fresh
    from the operating system)."""
    return random.Random(None if seed is None else f"replayllm-loadgen:{seed}:{index}")


def retry_delay(header: str | None, retries_done: int, now: float | None = None,
                rng: random.Random | None = None) -> float:
    """Seconds to wait before retry ``retries_done + 1``: the ``Retry-After`` header's, else
    the capped exponential backoff, its jitter drawn from ``rng`` (None: ``random``'s)."""
    asked = retry_after_s(header, now)
    if asked is not None:
        return asked
    backoff = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** min(retries_done, 60))
    return backoff * (rng or random).uniform(0.5, 1.0)
