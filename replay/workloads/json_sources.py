"""JSON traces as workload requests: Mooncake JSONL (``hash_ids``) and ShareGPT conversations.

Mooncake (FAST'25; also read by AIPerf, GuideLLM, SGLang's bench and Dynamo): one object a
line, ``timestamp`` (ms from the start), ``input_length``, ``output_length`` and ``hash_ids``
(one id per ``block_size`` tokens of the prompt; equal ids, equal contents). Each becomes a
recipe (``replay.workloads.recipe``) whose tokens are equal exactly where the ids are, at any
engine block size; Alibaba Bailian's traces, told by ``chat_id``, count ``timestamp`` in
seconds (``BAILIAN_FIELDS``). ShareGPT: a JSON array (or JSONL) of ``{"id",
"conversations": [{"from", "value"}, ...]}``, messages as ``{"role", "content"}`` too, or under
``messages`` (OpenAI chat, as many Hugging Face datasets) or ``conversation`` (LMSYS-Chat-1M,
WildChat); each question (with the system messages before it) and the answer after it is a
turn, the text tokenized with the Qwen vocabulary and the answer's length its ``max_tokens``
(conversation ids are ``ID#INDEX``: ShareGPT files repeat ids).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from replay.workloads.fields import (
    INT64_MAX,
    MAX_CONVERSATION_ID_LEN,
    WorkloadFormatError,
    is_unicode,
)
from replay.workloads.formats import NEEDS, not_format
from replay.workloads.import_options import (
    COUNT_LIMIT,
    LATER_TURN,
    MOONCAKE_BLOCK_SIZE,
    SALT_STRIDE,
    Gate,
    ImportOptions,
    make_request,
)
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import Request
from replay.workloads.text_input import json_records

MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
# Alibaba Bailian's traces (qwen-bailian-usagetraces-anon, ATC'25: ``qwen_traceA_blksz_16.jsonl``)
# hold Mooncake's fields and these, told by ``chat_id``: their ``timestamp`` is SECONDS from
# the start (``61.114``), not milliseconds, and their ``hash_ids`` name 16-token blocks. Each
# record's ``input_length`` is its whole prompt (the turns before included, their blocks shared
# through ``hash_ids``), so a record stays one request at its own arrival. Their block size is
# given as for any file (the CLI records the default 512 in the header's command): a wrong one
# is the ``hash_ids`` error, which names 16 for such a file.
BAILIAN_FIELDS = ("chat_id", "parent_chat_id", "type", "turn")
BAILIAN_BLOCK_SIZE = 16
# Roles, by side: a question (a tool's or a function's result is the model's input too), an
# answer (a tool call is the model's output), a system message (part of the next question).
HUMAN = ("human", "user", "tool", "function", "observation", "ipython")
ASSISTANT = ("gpt", "assistant", "chatgpt", "model", "bing", "bard", "function_call")
SYSTEM = ("system", "developer")
MESSAGE_FORMS = (("from", "value"), ("role", "content"))
# Content parts of text: OpenAI chat's and Anthropic's "text", the Responses API's
# "input_text" (a question's) and "output_text" (an answer's).
TEXT_PARTS = ("text", "input_text", "output_text")
# Why a conversation whose text is no Unicode string is dropped whole (counted, not sent).
NOT_UNICODE = "text with a lone surrogate, not Unicode"
# Why a conversation with messages but no turn (its questions empty, no answer) is dropped.
NO_TEXT = "conversation with no question text"
# A message's fields besides its role and text that say nothing of its text (OpenAI's tool
# calls and names, ShareGPT's rendered copy, axolotl's training weight): a message of its role
# and these only, its text absent, has no text (as ``content: null``); another field beside
# an absent text may be the text under another name, and is an error.
MESSAGE_METADATA = frozenset(("name", "tool_calls", "function_call", "tool_call_id", "refusal",
                              "weight", "markdown"))
# An entry's conversation: ShareGPT's, OpenAI chat's, LMSYS-Chat-1M's and WildChat's field.
CONVERSATION_FIELDS = ("conversations", "messages", "conversation")
# An entry's id: ShareGPT's, LMSYS-Chat-1M's (and the first WildChat's), WildChat-1M's (a
# conversation named by another field lost its id: ``#INDEX``).
ID_FIELDS = ("id", "conversation_id", "conversation_hash")


def _whole(value: object, low: int, high: int) -> int | None:
    """``value`` as an integer in [low, high], None if it is not one. A float that is a whole
    number (``10.0``: how JavaScript and pandas tools write one) is that integer, as a CSV
    trace's "12.0" is (``csv_sources._counts``): refused, a line of such a file was an error."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def _int(item: dict[str, Any], key: str, where: str, low: int, high: int) -> int:
    value = _whole(item.get(key), low, high)
    if value is None:
        raise WorkloadFormatError(f"{where}: field {key!r}: expected an integer in [{low}, "
                                  f"{high}], got {item.get(key)!r}")
    return value


def _hash_ids(item: dict[str, Any], where: str) -> list[int]:
    ids = item.get("hash_ids")
    if ids is None:  # absent or null (as in the workload format): no named blocks
        return []
    if not isinstance(ids, list):
        raise WorkloadFormatError(f"{where}: field 'hash_ids': expected a list of integers, got "
                                  f"{type(ids).__name__} {ids!r}")
    whole = [_whole(h, 0, INT64_MAX) for h in ids]
    for position, h in enumerate(whole):
        if h is None:
            raise WorkloadFormatError(f"{where}: field 'hash_ids': element {position} must be "
                                      f"an integer in [0, {INT64_MAX}], got {ids[position]!r}")
    return whole  # type: ignore[return-value]


def _is_bailian(item: dict[str, Any], where: str, first: tuple[str, bool] | None) -> bool:
    """Whether ``item`` is a Bailian record (``BAILIAN_FIELDS``); ``first``: the file's first
    record's (where, whether it was). One file holds one layout: its times are in one unit."""
    bailian = "chat_id" in item
    if first is not None and bailian != first[1]:
        has = "has field 'chat_id'" if bailian else "no field 'chat_id'"
        raise WorkloadFormatError(
            f"{where}: {has}, unlike the first record ({first[0]}): a Bailian record's "
            "timestamp is seconds, a Mooncake record's milliseconds; one file holds one of them")
    return bailian


def mooncake_requests(path: str | Path, options: ImportOptions) -> Iterator[tuple[str, float,
                                                                                Request]]:
    """(where, seconds, request) per record of a Mooncake-format JSONL file (or JSON array), or
    of a Bailian one (``BAILIAN_FIELDS``: its times in seconds). Seconds count from the
    first record's ``timestamp``, the milliseconds subtracted before dividing: epoch
    milliseconds divided first lost their last digits (1715299200456 ms less 1715299200123 ms
    came out 0.33300018 s)."""
    origin: float | None = None
    first: tuple[str, bool] | None = None
    for number, (where, item) in enumerate(json_records(path, "mooncake"), 1):
        if not isinstance(item, dict):
            raise WorkloadFormatError(f"{where}: expected a JSON object, got "
                                      f"{type(item).__name__}")
        missing = [k for k in NEEDS["mooncake"][1] if k not in item]
        if missing:  # another format's record (a ShareGPT conversation): say which, once
            raise not_format(f"{where}: not a Mooncake record: no field {missing[0]!r}",
                             "mooncake", ("fields", [str(k) for k in item]))
        bailian = _is_bailian(item, where, first)
        first = first or (where, bailian)
        known = MOONCAKE_FIELDS + (BAILIAN_FIELDS if bailian else ())
        unknown = [k for k in item if k not in known]
        if unknown and not options.ignore_unknown_fields:
            raise WorkloadFormatError(f"{where}: field {unknown[0]!r}: unknown field "
                                      "(--ignore-unknown-fields reads past it)")
        unit = "seconds" if bailian else "milliseconds"
        stamp = item.get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or \
                not np.isfinite(stamp) or stamp < 0:
            raise WorkloadFormatError(f"{where}: field 'timestamp': expected {unit} >= 0, "
                                      f"got {stamp!r}")
        length = _int(item, "input_length", where, 0, COUNT_LIMIT)
        output = _int(item, "output_length", where, 0, COUNT_LIMIT)
        ids = _hash_ids(item, where)
        block = options.block_size or MOONCAKE_BLOCK_SIZE
        if len(ids) > -(-length // block):
            hint = (f" (a Bailian trace's blocks are {BAILIAN_BLOCK_SIZE} tokens: --block-size "
                    f"{BAILIAN_BLOCK_SIZE})" if bailian and block != BAILIAN_BLOCK_SIZE else "")
            raise WorkloadFormatError(
                f"{where}: field 'hash_ids': {len(ids)} ids for {length} tokens at "
                f"--block-size {block} (at most {-(-length // block)}): is the block size "
                f"wrong?{hint}")
        salt = options.seed * SALT_STRIDE + number
        origin = stamp if origin is None else origin
        recipe = PromptRecipe(tuple(ids), block, length, salt)
        seconds = stamp - origin if bailian else (stamp - origin) / 1000.0
        yield where, seconds, make_request(recipe, output, options)


def _text(content: object, where: str) -> str | None:
    """A message's text: a string or a list of ``{"type": "text", "text": str}`` parts (or
    ``input_text``/``output_text``: TEXT_PARTS), joined by newlines; None if it is neither."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = []
    for position, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise WorkloadFormatError(f"{where}: content part {position} is {kind!r}: only "
                                      "text parts are read")
        texts.append(part["text"])
    return "\n".join(texts)


def _messages(entry: dict[str, Any], field: str, where: str) -> Iterator[tuple[str, str]]:
    """(role, text) of each message of ``entry[field]``, in ShareGPT's ``from``/``value`` form
    or the chat form's ``role``/``content``; a role is lower-cased and must be known."""
    messages = entry[field]
    if not isinstance(messages, list):
        raise WorkloadFormatError(f"{where}: field {field!r}: expected a list of messages, got "
                                  f"{type(messages).__name__}")
    for position, message in enumerate(messages):
        at = f"{where}: field {field!r}: message {position}"
        role = text = None
        if isinstance(message, dict):
            # a null field is absent, as a null column is: Arrow gives every message of a
            # Parquet column one struct type, the fields of the other form null in each
            given = {k: v for k, v in message.items() if v is not None}
            role_key, text_key = next((f for f in MESSAGE_FORMS if f[0] in given),
                                      MESSAGE_FORMS[0])
            role = given.get(role_key)
            if text_key in given or set(given) <= {role_key} | MESSAGE_METADATA:
                value = given.get(text_key)  # absent or null: no text
                text = "" if value is None else _text(value, at) if text_key == "content" \
                    else value
        if not isinstance(role, str) or not isinstance(text, str):
            got = (f"an object with fields {', '.join(map(str, message))}"
                   if isinstance(message, dict) else type(message).__name__)
            raise WorkloadFormatError(f'{at}: expected {{"from": str, "value": str}} or '
                                      f'{{"role": str, "content": str}}, got {got}')
        if role.lower() not in HUMAN + ASSISTANT + SYSTEM:
            raise WorkloadFormatError(
                f"{at}: unknown role {role!r} (the prompt side: {', '.join(HUMAN)}; the answer "
                f"side: {', '.join(ASSISTANT)}; a system message: {', '.join(SYSTEM)})")
        yield role.lower(), text


def _conversation(entry: dict[str, Any], where: str) -> list[tuple[str, str]]:
    """The (role, text) messages of an entry's conversation field (``CONVERSATION_FIELDS``).
    An entry holding two of them (a dataset converted from one form, the other kept) is read
    where they hold the same messages (roles by side: ``human`` is ``user``) and is an error
    where they differ: which one to send is the user's choice, never a silent one."""
    fields = [f for f in CONVERSATION_FIELDS if f in entry]
    # a null one beside another is absent (a ``datasets`` JSONL export of a shard holding two
    # of these columns keeps each row's empty one as null); alone, it is the error below
    fields = [f for f in fields if entry[f] is not None] or fields
    if not fields:
        raise not_format(f"{where}: not a ShareGPT conversation: no field 'conversations', "
                         "'messages' or 'conversation'", "sharegpt",
                         ("fields", [str(k) for k in entry]))
    messages = list(_messages(entry, fields[0], where))
    for other in fields[1:]:
        others = list(_messages(entry, other, where))
        differ = [i for i, (a, b) in enumerate(zip(messages, others))
                  if (_side(a[0]), a[1]) != (_side(b[0]), b[1])]
        if differ or len(others) != len(messages):
            at = (f"message {differ[0]} differs" if differ else
                  f"{len(messages)} and {len(others)} messages")
            raise WorkloadFormatError(
                f"{where}: fields {fields[0]!r} and {other!r} hold different conversations "
                f"({at}): keep one of them in each entry")
    return messages


def _conversation_id(entry: dict[str, Any], index: int) -> str:
    """``ID#INDEX`` (ShareGPT files repeat some ids; the id is the first of ``ID_FIELDS`` an
    entry has), within the workload format's MAX_CONVERSATION_ID_LEN characters (a longer id
    was written, and the file then refused by every reader): the id is cut, ``#INDEX`` keeps it
    unique. An id that is neither a string nor an integer (null, an object) is left out."""
    name = next((entry[f] for f in ID_FIELDS if f in entry), None)
    if isinstance(name, bool) or not isinstance(name, (str, int)):
        name = ""
    suffix = f"#{index}"
    return f"{str(name)[:MAX_CONVERSATION_ID_LEN - len(suffix)]}{suffix}"


def _side(role: str) -> str:
    return "question" if role in HUMAN else "answer" if role in ASSISTANT else "system"


def _dropped_whole(messages: list[tuple[str, str]], start: float, reason: str
                   ) -> Iterator[tuple[float | None, str]]:
    """The pairs of a conversation ``select`` drops whole (its first turn for ``reason``), as
    ``sharegpt_requests`` gives them but without tokenizing: a question is text if not empty."""
    pending, turn = False, 0
    for role, text in messages:
        if role not in ASSISTANT:
            pending = pending or bool(text)
            continue
        when = start if turn == 0 else None
        if not pending:
            yield when, "answer with no question text before it"
            continue
        yield when, reason if turn == 0 else LATER_TURN
        pending, turn = False, turn + 1
    if pending:
        yield (start, reason) if turn == 0 else (None, LATER_TURN)


def sharegpt_requests(path: str | Path, options: ImportOptions, gate: Gate | None = None
                      ) -> Iterator[tuple[float | None, Request | str]]:
    """(seconds or None for a later turn, request) per turn of each conversation; what is read
    but sent as no turn (a conversation without messages, an answer with no question text
    before it, a conversation that makes no turn at all) is the reason instead, counted as
    dropped by ``replay.workloads.imports``: every conversation read is counted.

    A conversation is ``conversations``, ``messages`` or ``conversation`` (``_conversation``):
    messages in ShareGPT's ``from``/``value`` form or the chat form's ``role``/``content``.
    Questions, and system messages, before an answer are its turn's prompt. Conversations
    start in file order, never earlier than the one before: reading stops after a whole
    conversation where ``gate`` is ``closed`` (each has its own id, so no later entry holds a
    turn of a kept one)."""
    from engine.model.checkpoint import default_model_dir
    from engine.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(options.model or default_model_dir())
    rng = np.random.default_rng(options.seed)
    start = 0.0
    for index, (where, entry) in enumerate(json_records(path, "sharegpt")):
        if not isinstance(entry, dict):
            raise WorkloadFormatError(f"{where}: expected a JSON object with field "
                                      f"'conversations', 'messages' or 'conversation', got "
                                      f"{type(entry).__name__}")
        messages = _conversation(entry, where)
        conversation = _conversation_id(entry, index)
        if options.rate is not None and index:
            start += float(rng.exponential(1.0 / options.rate))
        dropped = gate.drops(start) if gate is not None else None
        if dropped is None and not all(is_unicode(text) for _, text in messages):
            dropped = NOT_UNICODE
        pairs = (_dropped_whole(messages, start, dropped) if dropped is not None  # no tokenizing
                 else _turns(messages, start, conversation, tokenizer, options))
        given = False
        for pair in pairs:
            given = True
            yield pair
        if not given:  # read, and sent as no turn: counted, never skipped in silence
            yield start, NO_TEXT if messages else "empty conversation"
        if gate is not None and (why := gate.closed(start)) is not None:
            gate.stop(where, why)
            return


def _turns(messages: list[tuple[str, str]], start: float, conversation: str, tokenizer: Any,
           options: ImportOptions) -> Iterator[tuple[float | None, Request | str]]:
    """``sharegpt_requests``'s pairs of one conversation starting at ``start``, tokenized."""
    pending: list[int] = []
    turn = 0
    for role, text in messages:
        tokens = tokenizer.encode(text, add_special_tokens=False)
        if role not in ASSISTANT:
            pending += tokens
            continue
        if not pending:  # nothing to send (ShareGPT splits start with one)
            yield (start if turn == 0 else None), "answer with no question text before it"
            continue
        extra: dict[str, Any] = {"conversation_id": conversation, "turn": turn}
        yield (start if turn == 0 else None), make_request(pending, len(tokens), options,
                                                           **extra)
        pending, turn = [], turn + 1
    if pending:  # a last question with no answer: sent, its output length 0 (counted)
        yield (start if turn == 0 else None), make_request(
            pending, 0, options, conversation_id=conversation, turn=turn)
