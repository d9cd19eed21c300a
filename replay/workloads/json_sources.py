"""JSON traces as workload requests: Mooncake JSONL (``hash_ids``) and ShareGPT conversations.

Mooncake (FAST'25; also read by AIPerf, GuideLLM, SGLang's bench and Dynamo): one object a
line, ``timestamp`` (ms from the start), ``input_length``, ``output_length`` and ``hash_ids``
(one id per ``block_size`` tokens of the prompt; equal ids, equal contents). Each becomes a
recipe (``replay.workloads.recipe``) whose tokens are equal exactly where the ids are, at any
engine block size. ShareGPT: a JSON array (or JSONL) of ``{"id", "conversations": [{"from",
"value"}, ...]}``; each human message and the answer after it is a turn, the text tokenized
with the Qwen vocabulary and the answer's length its ``max_tokens`` (conversation ids are
``ID#INDEX``: ShareGPT files repeat ids).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from replay.workloads.fields import INT64_MAX, WorkloadFormatError
from replay.workloads.formats import NEEDS, not_format
from replay.workloads.import_options import COUNT_LIMIT, SALT_STRIDE, ImportOptions, make_request
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import Request
from replay.workloads.text_input import json_records

MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
HUMAN, ASSISTANT, SYSTEM = ("human", "user"), ("gpt", "assistant", "chatgpt", "bing", "bard"), \
    ("system",)


def _int(item: dict[str, Any], key: str, where: str, low: int, high: int) -> int:
    value = item.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise WorkloadFormatError(f"{where}: field {key!r}: expected an integer in [{low}, "
                                  f"{high}], got {value!r}")
    return value


def _hash_ids(item: dict[str, Any], where: str) -> list[int]:
    ids = item.get("hash_ids")
    if ids is None:  # absent or null (as in the workload format): no named blocks
        return []
    if not isinstance(ids, list):
        raise WorkloadFormatError(f"{where}: field 'hash_ids': expected a list of integers, got "
                                  f"{type(ids).__name__} {ids!r}")
    for position, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= INT64_MAX:
            raise WorkloadFormatError(f"{where}: field 'hash_ids': element {position} must be "
                                      f"an integer in [0, {INT64_MAX}], got {h!r}")
    return ids


def mooncake_requests(path: str | Path, options: ImportOptions) -> Iterator[tuple[str, float,
                                                                                Request]]:
    """(where, seconds, request) per record of a Mooncake-format JSONL file (or JSON array)."""
    block = options.block_size
    for number, (where, item) in enumerate(json_records(path, "mooncake"), 1):
        if not isinstance(item, dict):
            raise WorkloadFormatError(f"{where}: expected a JSON object, got "
                                      f"{type(item).__name__}")
        missing = [k for k in NEEDS["mooncake"][1] if k not in item]
        if missing:  # another format's record (a ShareGPT conversation): say which, once
            raise not_format(f"{where}: not a Mooncake record: no field {missing[0]!r}",
                             "mooncake", ("fields", [str(k) for k in item]))
        unknown = [k for k in item if k not in MOONCAKE_FIELDS]
        if unknown and not options.ignore_unknown_fields:
            raise WorkloadFormatError(f"{where}: field {unknown[0]!r}: unknown field "
                                      "(--ignore-unknown-fields reads past it)")
        stamp = item.get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or \
                not np.isfinite(stamp) or stamp < 0:
            raise WorkloadFormatError(f"{where}: field 'timestamp': expected milliseconds >= 0,"
                                      f" got {stamp!r}")
        length = _int(item, "input_length", where, 0, COUNT_LIMIT)
        output = _int(item, "output_length", where, 0, COUNT_LIMIT)
        ids = _hash_ids(item, where)
        if len(ids) > -(-length // block):
            raise WorkloadFormatError(
                f"{where}: field 'hash_ids': {len(ids)} ids for {length} tokens at "
                f"--block-size {block} (at most {-(-length // block)}): is the block size wrong?")
        salt = options.seed * SALT_STRIDE + number
        yield where, stamp / 1000.0, make_request(PromptRecipe(tuple(ids), block, length, salt),
                                                  output, options)


def sharegpt_requests(path: str | Path, options: ImportOptions
                      ) -> Iterator[tuple[float | None, Request | str]]:
    """(seconds or None for a later turn, request) per turn of each conversation; what is read
    but sent as no turn (a conversation without messages, an answer with no question text
    before it) is the reason instead, counted as dropped by ``replay.workloads.imports``."""
    from engine.model.checkpoint import default_model_dir
    from engine.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(options.model or default_model_dir())
    rng = np.random.default_rng(options.seed)
    start = 0.0
    for index, (where, entry) in enumerate(json_records(path, "sharegpt")):
        if isinstance(entry, dict) and "conversations" not in entry:
            raise not_format(f"{where}: not a ShareGPT conversation: no field 'conversations'",
                             "sharegpt", ("fields", [str(k) for k in entry]))
        messages = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("from"), str)
            and isinstance(m.get("value"), str) for m in messages
        ):
            raise WorkloadFormatError(f"{where}: field 'conversations': expected a list of "
                                      "{\"from\": str, \"value\": str}")
        conversation = f"{entry.get('id', '')}#{index}"  # ShareGPT files repeat some ids
        if options.rate is not None and index:
            start += float(rng.exponential(1.0 / options.rate))
        if not messages:
            yield start, "empty conversation"
        pending: list[int] = []
        turn = 0
        for message in messages:
            role = message["from"].lower()
            tokens = tokenizer.encode(message["value"], add_special_tokens=False)
            if role in HUMAN or role in SYSTEM:
                pending += tokens
                continue
            if role not in ASSISTANT:
                raise WorkloadFormatError(f"{where}: field 'from': unknown role {role!r}")
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
