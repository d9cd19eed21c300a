"""A request's prompt as token ids, prepared where it cannot stall the frontend's event loop.

Tokenizing is the one frontend cost per request that grows with what the client sends: BPE
over a few MB of text takes seconds. On the event loop that would stop every other stream's
tokens and the acceptance of new requests for as long. So (``PromptPreparer``):

- a prompt of at most ``INLINE_PROMPT_CHARS`` characters (chat: every string of the messages) is
  tokenized on the loop: about 1.5 ms at most, less than what a hop to a thread costs when the
  loop is busy (the thread waits for the interpreter, up to its 5 ms switch interval, to start
  and again to hand the result back);
- a longer one, chat template and all, in a small thread pool (``PREP_WORKERS``). The
  ``tokenizers`` backend encodes with the interpreter released there (``encode_batch_fast``:
  its plain ``encode`` holds the GIL for the whole encode, measured 1.4 s of a stalled loop
  for 2 MB), so the loop runs on meanwhile; a Python template or a transformers tokenizer
  interleaves with the loop at least every switch interval;
- a text that cannot fit the context is refused before it is encoded where a safe bound says so
  (``TokenFloor``), else after, from the encoding's length, before its ids become a list.

Token ids sent as the prompt need no tokenizing: they are checked on the loop, the length first.
What the engine then records as the request's arrival is ``engine.server.app``'s to decide.

The pool's queue is bounded: with ``max_waiting`` prompts already waiting for a thread (beyond
the ``PREP_WORKERS`` being tokenized), a new long prompt is a 429 whose ``Retry-After`` falls
within the time the pool needs for what it holds (from its measured rate), spread over it from
one refusal to the next so refused clients do not return together; many multi-MB prompts at once
hold bounded memory and cannot queue medium ones behind them for ever; a short prompt, tokenized
on the loop, is never refused. A client that leaves while its prompt waits or tokenizes
(``left``) is dropped: a waiting prompt leaves the queue, a running one finishes unused, and
nothing reaches the engine (``ClientLeft``).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import unicodedata
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from engine.model.fast_tokenizer import FastTokenizer
from engine.server.chat import chat_prompt_text
from engine.server.protocol import ApiError, ParsedRequest

# Prompts up to this many characters are tokenized on the event loop (~0.35 us a character).
INLINE_PROMPT_CHARS = 4096
# Threads that tokenize longer prompts: two long ones at once, each on a core; more wait.
PREP_WORKERS = 2
# Long prompts that may wait for a thread before new ones are refused (429).
MAX_WAITING_PROMPTS = 4 * PREP_WORKERS
# The tokenizer's seconds per character until the pool has measured its own (BPE on the
# development VM: 2 MB in about 1 s), and the longest Retry-After it suggests.
SECONDS_PER_CHAR = 0.5e-6
MAX_RETRY_AFTER_S = 60
# (sqrt(5) - 1) / 2: the shifts n * this mod 1 of successive refusals stay evenly spread.
GOLDEN_FRACTION = 0.6180339887498949


class ClientLeft(Exception):
    """The client disconnected while its prompt waited for the pool or was tokenized."""


class PromptPreparer:
    """Turns a parsed request's prompt into token ids, on the loop or in its thread pool.

    ``max_model_len``: the context; a prompt of that many tokens or more is refused (not one
    token of room). ``max_waiting``: long prompts that may wait for a thread (then a 429).
    ``close()`` stops the pool (a tokenization already running finishes)."""

    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int,
                 workers: int = PREP_WORKERS, max_waiting: int = MAX_WAITING_PROMPTS) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.floor = token_floor(tokenizer)
        backend = tokenizer.backend if isinstance(tokenizer, FastTokenizer) else None
        self._encode_fast = getattr(backend, "encode_batch_fast", None)
        self.workers, self.max_waiting = workers, max_waiting
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="replayllm-prompt")
        self._lock = threading.Lock()  # the pool's threads end jobs; the loop adds them
        self._in_pool = 0  # prompts waiting for a thread or being tokenized
        self._in_pool_chars = 0
        self._seconds_per_char = SECONDS_PER_CHAR
        self._refusals = 0  # 429s so far: where each one's Retry-After falls (_retry_after_s)

    @property
    def in_pool(self) -> int:
        """Long prompts the pool holds now: waiting for a thread or being tokenized."""
        return self._in_pool

    @property
    def in_pool_chars(self) -> int:
        """The characters of the prompts ``in_pool`` (chat: every string of their messages)."""
        return self._in_pool_chars

    async def token_ids(self, parsed: ParsedRequest,
                        left: Callable[[], Awaitable[None]] | None = None
                        ) -> tuple[list[int], str]:
        """The prompt's token ids and the field they came from; ``ApiError`` when it is empty,
        too long for the context or names a token outside the vocabulary, a 429 when the pool
        is full. ``left``: returns once the client is gone; if that comes first while the
        prompt is in the pool, ``ClientLeft``."""
        if parsed.chat:
            # Every string the template renders (contents, names, reasoning).
            size = sum(len(value) for message in parsed.messages for value in message.values())
        elif isinstance(parsed.prompt, str):
            size = len(parsed.prompt)
        else:
            return self._given_ids(list(parsed.prompt or [])), "prompt"
        if size <= INLINE_PROMPT_CHARS:
            return self.prepare(parsed)
        job = asyncio.wrap_future(self._submit(parsed, size))
        if left is None:
            return await job
        gone = asyncio.ensure_future(left())
        try:
            done, _ = await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this handler was cancelled: a waiting job leaves the queue
            gone.cancel()
            job.cancel()
            raise
        if gone in done:  # the client left (before, or as, its prompt was ready)
            gone.exception()
            if not job.cancel() and not job.cancelled():
                job.exception()  # retrieved: its error does not matter to a client that left
            raise ClientLeft
        gone.cancel()
        return job.result()  # its ids, its ApiError, or cancelled (the pool was shut down)

    def _submit(self, parsed: ParsedRequest, size: int) -> Future:
        """Queue ``parsed`` (a prompt of ``size`` characters) for the pool, or a 429."""
        with self._lock:
            if self._in_pool >= self.workers + self.max_waiting:
                retry = self._retry_after_s()
                raise ApiError(
                    f"the server is tokenizing {self._in_pool} long prompts already ("
                    f"{self.max_waiting} may wait; replayllm serve --max-waiting-prompts); "
                    f"retry after {retry} s", status=429, kind="rate_limit_error",
                    code="rate_limit_exceeded", headers={"Retry-After": str(retry)})
            self._in_pool += 1
            self._in_pool_chars += size
        try:
            future = self._pool.submit(self._timed_prepare, parsed, size)
        except BaseException:  # the pool is shut down (the server is stopping)
            self._left_pool(size)
            raise
        future.add_done_callback(lambda _: self._left_pool(size))
        return future

    def _retry_after_s(self) -> int:
        """A refused prompt's ``Retry-After`` (with the lock held): its place among the pool's
        slots, each freed at about its share of the time the pool needs for what it holds (at
        most ``MAX_RETRY_AFTER_S``), shifted by up to half a share either way, so refused
        clients come back spread over that time rather than together. The place and the shift
        come from the count of refusals (the shift: its golden-ratio fraction), so they are
        reproducible. Whole seconds (HTTP's), at least 1: a pool that drains in a second or
        less sends every refused client back after 1 s."""
        drain_s = self._in_pool_chars * self._seconds_per_char / self.workers
        slots = max(1, self._in_pool)
        count = self._refusals
        self._refusals += 1
        place = (count % slots + (count * GOLDEN_FRACTION) % 1.0) / slots
        retry = math.ceil(min(drain_s, MAX_RETRY_AFTER_S) * (place + 0.5 / slots))
        return min(MAX_RETRY_AFTER_S, max(1, retry))

    def _timed_prepare(self, parsed: ParsedRequest, size: int) -> tuple[list[int], str]:
        start = time.perf_counter()
        prepared = self.prepare(parsed)  # a refusal (too long) says nothing of the rate
        rate = (time.perf_counter() - start) / size  # its moving average: for Retry-After
        self._seconds_per_char = 0.7 * self._seconds_per_char + 0.3 * rate
        return prepared

    def _left_pool(self, size: int) -> None:
        with self._lock:
            self._in_pool -= 1
            self._in_pool_chars -= size

    def prepare(self, parsed: ParsedRequest) -> tuple[list[int], str]:
        """``token_ids`` of a text prompt or chat, here and now (any thread)."""
        if parsed.chat:
            text, field = chat_prompt_text(self.tokenizer, parsed.messages), "messages"
        else:
            text, field = str(parsed.prompt), "prompt"
        if self.floor is not None:
            at_least = self.floor.tokens_at_least(text)
            if at_least >= self.max_model_len:
                raise self._too_long(f"the prompt's text ({_utf8_len(text)} bytes) is at least "
                                     f"{at_least} tokens", field)
        encoded = self.encode(text)
        self._check_length(len(encoded), field)
        return (encoded if isinstance(encoded, list) else encoded.ids), field

    def encode(self, text: str) -> Any:
        """``text``'s encoding, without special tokens added: a list of ids, or a ``tokenizers``
        ``Encoding`` (its ``len`` is the token count, ``ids`` the list), encoded with the GIL
        released (the same ids as ``FastTokenizer.encode``)."""
        if self._encode_fast is not None:
            return self._encode_fast([text], add_special_tokens=False)[0]
        return self.tokenizer.encode(text, add_special_tokens=False)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _given_ids(self, ids: list[int]) -> list[int]:
        self._check_length(len(ids), "prompt")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            bad = next(t for t in ids if not 0 <= t < self.vocab_size)
            raise ApiError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})",
                           "prompt")
        return ids

    def _check_length(self, count: int, field: str) -> None:
        if not count:
            raise ApiError("the prompt is empty", field)
        if count >= self.max_model_len:
            raise self._too_long(f"the prompt has {count} tokens", field)

    def _too_long(self, what: str, field: str) -> ApiError:
        return ApiError(f"this model's maximum context length is {self.max_model_len} tokens; "
                        f"{what}, which leaves no room for an answer", field,
                        code="context_length_exceeded")


class TokenFloor:
    """The fewest tokens a text can encode to, known without encoding it, for a tokenizer that
    encodes every byte of its input (``token_floor``): each token stands for at most
    ``max_token_bytes`` bytes of the text, so there are at least bytes / ``max_token_bytes``.

    ``nfc``: the tokenizer NFC-normalizes first, which can shorten a text that is not NFC
    already; such a text gets no bound (0)."""

    def __init__(self, max_token_bytes: int, nfc: bool) -> None:
        self.max_token_bytes = max_token_bytes
        self.nfc = nfc

    def tokens_at_least(self, text: str) -> int:
        if not text.isascii() and self.nfc and not unicodedata.is_normalized("NFC", text):
            return 0
        return -(-_utf8_len(text) // self.max_token_bytes)


def token_floor(tokenizer: Any) -> TokenFloor | None:
    """A ``TokenFloor`` where the tokenizer provably keeps every byte: a ``FastTokenizer`` over
    byte-level BPE (every byte in the vocabulary, so none is dropped as unknown), normalized by
    NFC or not at all, split without removing anything, with no added token that swallows the
    whitespace beside it. Anything else (a tokenizer that may drop or merge text, e.g. collapse
    runs of spaces) gets None: no bound, since a text of any length could be a few tokens."""
    if not isinstance(tokenizer, FastTokenizer):
        return None
    try:
        from tokenizers import pre_tokenizers

        backend = tokenizer.backend
        normalizer = backend.normalizer
        if type(backend.model).__name__ != "BPE" or not (
                normalizer is None or type(normalizer).__name__ == "NFC"):
            return None
        state = json.loads(backend.pre_tokenizer.__getstate__())
        parts = state.get("pretokenizers", [state]) if state.get("type") == "Sequence" else [state]
        if not any(p.get("type") == "ByteLevel" for p in parts) or any(
                p.get("type") not in ("ByteLevel", "Split") or p.get("behavior") == "Removed"
                for p in parts):
            return None
        vocab = backend.get_vocab(with_added_tokens=False)
        if any(char not in vocab for char in pre_tokenizers.ByteLevel.alphabet()):
            return None
        added = list(backend.get_added_tokens_decoder().values())
        if any(token.lstrip or token.rstrip for token in added):
            return None
        # A byte-level token's characters are one byte each; an added token is its own text.
        longest = max([len(token) for token in vocab]
                      + [_utf8_len(token.content) for token in added])
    except Exception:  # noqa: BLE001 - another tokenizers version: no bound, never a wrong one
        return None
    return TokenFloor(longest, nfc=normalizer is not None)


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
