"""The workload file format's fields and their validation (docs/workloads.md is the spec).

One record (a JSONL line or a Parquet row, as a dict) becomes one ``Request`` through
``request_from_record``; every problem raises ``WorkloadFormatError`` naming the file, the line
(or row) and the field in one line. Types are strict: a string is not a bool, a bool is not an
int, a float is not a token id. Both storage formats use this one rule.
"""

from __future__ import annotations

import math
from typing import Any

from engine.errors import InvalidRequestError
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import REFERENCE_TEMPERATURE, Request

FORMAT_NAME = "replayllm_workload"  # the JSONL header line's key and the Parquet metadata key
FORMAT_VERSION = 1
READABLE_VERSIONS = (1,)
MAX_TOKENS_LIMIT = 1 << 20  # max_tokens and a recipe's prompt_len: at most this
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
MAX_CONVERSATION_ID_LEN = 256
# The latest arrival and the longest think time a request may ask for: a run (and loadgen) waits
# for them on the wall clock, so a typo (1e12) would wait for ever; a week is far past any
# recorded production trace. ``check_request`` holds every request to it.
MAX_ARRIVAL_S = 7 * 24 * 3600.0

FIELDS = (
    "prompt_token_ids", "prompt", "hash_ids", "hash_block_size", "prompt_len", "salt",
    "max_tokens", "temperature", "ignore_eos", "arrival_s", "conversation_id", "turn",
    "think_time_s", "priority",
)
_RECIPE_FIELDS = ("hash_ids", "hash_block_size", "prompt_len", "salt")


class WorkloadFormatError(InvalidRequestError):
    """A workload file or one of its records is malformed (the message names file and line)."""


def check_temperature(value: float, option: str = "--temperature") -> None:
    """The one rule of a request's temperature, for the options that set one: finite, >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not (math.isfinite(value) and value >= 0):
        raise InvalidRequestError(f"{option} must be a finite number >= 0, got {value!r}")


def check_request(request: Request, where: str) -> None:
    """The rule every request meets before it is run, simulated or sent (``run``, ``whatif``,
    ``tune``, ``loadgen``) and before ``workload generate`` or ``import`` writes it: an arrival and
    a think time that are finite numbers of seconds in [0, ``MAX_ARRIVAL_S``] (so no driver waits
    for ever), ``max_tokens`` an integer in [1, int32] (so no trace column overflows).

    Raises ``InvalidRequestError``, one line starting with ``where``."""
    for name in ("arrival_s", "think_time_s"):
        value = getattr(request, name)
        if not (_is_number(value) and math.isfinite(value) and 0 <= value <= MAX_ARRIVAL_S):
            raise InvalidRequestError(f"{where}: {name} must be a finite number of seconds in "
                                      f"[0, {MAX_ARRIVAL_S:.0f}], got {value!r}")
    if not (_is_int(request.max_tokens) and 1 <= request.max_tokens <= INT32_MAX):
        raise InvalidRequestError(f"{where}: max_tokens must be an integer in [1, {INT32_MAX}], "
                                  f"got {request.max_tokens!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Record:
    """Field access on one record, raising errors that name where it is."""

    def __init__(self, item: dict[str, Any], where: str) -> None:
        self.item, self.where = item, where

    def fail(self, field: str, problem: str) -> WorkloadFormatError:
        return WorkloadFormatError(f"{self.where}: field {field!r}: {problem}")

    def has(self, field: str) -> bool:
        return self.item.get(field) is not None

    def int_(self, field: str, low: int, high: int, default: int | None = None) -> int:
        value = self.item.get(field)
        if value is None:
            if default is None:
                raise self.fail(field, "missing (required)")
            return default
        if not _is_int(value):
            raise self.fail(field, f"must be an integer, got {type(value).__name__} {value!r}")
        if not low <= value <= high:
            raise self.fail(field, f"must be in [{low}, {high}], got {value}")
        return value

    def float_(self, field: str, default: float) -> float:
        value = self.item.get(field)
        if value is None:
            return default
        if not _is_number(value):
            raise self.fail(field, f"must be a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value) or value < 0:
            raise self.fail(field, f"must be finite and >= 0, got {value}")
        return float(value)

    def bool_(self, field: str, default: bool) -> bool:
        value = self.item.get(field)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(field, f"must be true or false, got {type(value).__name__} {value!r}")
        return value

    def int_list(self, field: str, low: int, high: int) -> list[int]:
        value = self.item.get(field)
        if not isinstance(value, list):
            raise self.fail(field, f"must be a list of integers, got {type(value).__name__}")
        for position, token in enumerate(value):
            if not _is_int(token) or not low <= token <= high:
                raise self.fail(field, f"element {position} must be an integer in "
                                f"[{low}, {high}], got {token!r}")
        return value


def is_unicode(text: str) -> bool:
    """Whether ``text`` is Unicode text: JSON may hold a lone surrogate (``"\\ud83d"`` without
    its pair, an emoji cut in a scraped dump), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _prompt(record: _Record) -> list[int] | str | PromptRecipe:
    given = [f for f in ("prompt_token_ids", "prompt", "prompt_len") if record.has(f)]
    if len(given) != 1:
        raise record.fail(given[1] if given else "prompt_token_ids",
                          "give exactly one of prompt_token_ids, prompt, prompt_len (a recipe)"
                          + (f"; got {', '.join(given)}" if given else ""))
    stray = [f for f in _RECIPE_FIELDS if record.has(f)] if given[0] != "prompt_len" else []
    if stray:
        raise record.fail(stray[0], "belongs to a recipe (prompt_len), not to " + given[0])
    if given[0] == "prompt_token_ids":
        tokens = record.int_list("prompt_token_ids", 0, INT32_MAX)
        if not tokens:
            raise record.fail("prompt_token_ids", "must not be empty")
        return tokens
    if given[0] == "prompt":
        text = record.item["prompt"]
        if not isinstance(text, str) or not text:
            raise record.fail("prompt", f"must be a non-empty string, got {text!r}")
        if not is_unicode(text):  # no tokenizer takes it: refused here, by file and line
            raise record.fail("prompt", "holds a lone surrogate (JSON's \\ud83d without its "
                              "pair): not Unicode text")
        return text
    length = record.int_("prompt_len", 1, MAX_TOKENS_LIMIT)
    hash_ids = record.int_list("hash_ids", 0, INT64_MAX) if record.has("hash_ids") else []
    block_size = record.int_("hash_block_size", 1, MAX_TOKENS_LIMIT, default=0 if not hash_ids
                             else None)
    if hash_ids and len(hash_ids) > -(-length // block_size):
        raise record.fail("hash_ids", f"names {len(hash_ids)} blocks of {block_size} tokens; a "
                          f"prompt of {length} tokens has {-(-length // block_size)}")
    salt = record.int_("salt", -INT64_MAX - 1, INT64_MAX, default=0)
    return PromptRecipe(tuple(hash_ids), max(block_size, 1), length, salt)


def request_from_record(item: Any, where: str, ignore_unknown_fields: bool = False) -> Request:
    """Validate one record and build its Request (docs/workloads.md, "Fields")."""
    if not isinstance(item, dict):
        raise WorkloadFormatError(f"{where}: a request must be a JSON object, got "
                                  f"{type(item).__name__}")
    record = _Record(item, where)
    if not ignore_unknown_fields:
        unknown = [k for k in item if k not in FIELDS]
        if unknown:
            raise record.fail(unknown[0], "unknown field (--ignore-unknown-fields reads past it)")
    prompt = _prompt(record)
    conversation = item.get("conversation_id")
    if conversation is not None:
        if _is_int(conversation):
            conversation = str(conversation)
        if not isinstance(conversation, str) or not 0 < len(conversation) <= \
                MAX_CONVERSATION_ID_LEN:
            raise record.fail("conversation_id", "must be a string of 1 to "
                              f"{MAX_CONVERSATION_ID_LEN} characters or an integer, got "
                              f"{conversation!r}")
    turn = record.int_("turn", 0, INT32_MAX, default=0)
    if turn and conversation is None:
        raise record.fail("turn", f"turn {turn} needs a conversation_id")
    if turn and record.has("arrival_s"):
        raise record.fail("arrival_s", "a later turn (turn >= 1) has no arrival time: it is "
                          "sent think_time_s after the previous turn finished")
    if not turn and record.has("think_time_s"):
        raise record.fail("think_time_s", "only later turns (turn >= 1) have a think time")
    temperature = record.float_("temperature", REFERENCE_TEMPERATURE)
    return Request(
        prompt=prompt,
        max_tokens=record.int_("max_tokens", 1, MAX_TOKENS_LIMIT),
        temperature=temperature,
        ignore_eos=record.bool_("ignore_eos", False),
        arrival_s=record.float_("arrival_s", 0.0),
        conversation_id=conversation,
        turn=turn,
        think_time_s=record.float_("think_time_s", 0.0),
        priority=record.int_("priority", -INT32_MAX - 1, INT32_MAX, default=0),
    )


def record_from_request(request: Request) -> dict[str, Any]:
    """The record of a Request (only fields that differ from their defaults, prompt always)."""
    out: dict[str, Any] = {}
    prompt = request.prompt
    if isinstance(prompt, PromptRecipe):
        if prompt.hash_ids:
            out["hash_ids"] = list(prompt.hash_ids)
            out["hash_block_size"] = prompt.block_size
        out["prompt_len"] = prompt.length
        if prompt.salt:
            out["salt"] = prompt.salt
    elif isinstance(prompt, str):
        out["prompt"] = prompt
    else:
        out["prompt_token_ids"] = list(prompt)
    out["max_tokens"] = request.max_tokens
    if request.temperature != REFERENCE_TEMPERATURE:
        out["temperature"] = request.temperature
    if request.ignore_eos:
        out["ignore_eos"] = True
    if request.follows_previous_turn:
        if request.think_time_s:
            out["think_time_s"] = request.think_time_s
    elif request.arrival_s:
        out["arrival_s"] = request.arrival_s
    if request.conversation_id is not None:
        out["conversation_id"] = request.conversation_id
        if request.turn:
            out["turn"] = request.turn
    if request.priority:
        out["priority"] = request.priority
    return out


class ConversationOrder:
    """Checks, while streaming, that each conversation's turns come in order 0, 1, 2, ..."""

    def __init__(self) -> None:
        self.last_turn: dict[str, int] = {}

    def check(self, request: Request, where: str) -> None:
        conversation = request.conversation_id
        if conversation is None:
            return
        last = self.last_turn.get(conversation, -1)
        if request.turn != last + 1:
            expected = "turn 0 (a new conversation)" if last < 0 else f"turn {last + 1}"
            raise WorkloadFormatError(
                f"{where}: field 'turn': conversation {conversation!r} expects {expected} "
                f"here, got turn {request.turn}"
            )
        self.last_turn[conversation] = request.turn
