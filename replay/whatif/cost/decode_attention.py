"""What attention reads, for the step-time model's attention features
(``features.StepFeatures.decode_kv_tokens``, ``decode_longest_tokens``,
``prefill_longest_tokens``): the paged decode kernel runs a program per sequence, KV head and
split (``engine.attention_splits``), so its last wave waits for the longest context over its
splits; a KV block that several rows of a step read (a shared prefix) comes from memory once.
The prefill kernel runs a program per query tile, sequence and KV head, each reading the keys
up to its tile: the longest reads the longest prefill context, all of it (a prompt's new tokens
over its cached prefix), however few tokens are new."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine.attention_splits import choose_num_splits
from replay.recorded import RecordedEvents

DEFAULT_KV_HEADS = 1  # a trace whose header names no model: one program per sequence and split


def kv_heads_of(header: Mapping[str, Any]) -> int:
    """The model's KV heads (the decode-attention kernel runs a program per sequence, KV head and
    split), from a trace header."""
    return int((header.get("model") or {}).get("num_kv_heads") or DEFAULT_KV_HEADS)


def longest_program_tokens(longest_context: float, batch_size: int, kv_heads: int) -> float:
    """The KV tokens the longest decode-attention program reads: the longest decode context over
    the splits the kernel cuts each context into for a batch of ``batch_size`` rows."""
    return longest_context / choose_num_splits(batch_size, kv_heads)


def decode_features(contexts: Sequence[int], block_tables: Sequence[Sequence[int]],
                    block_size: int, batch_size: int, kv_heads: int) -> tuple[float, float]:
    """(``decode_kv_tokens``, ``decode_longest_tokens``) of a step's decode rows, from their
    contexts and block tables: a block in several rows' tables is read once (``block_size``
    0: every row's context counted)."""
    if not contexts:
        return 0.0, 0.0
    shared = 0
    if block_size:  # 0: sharing not counted (no need to look at the tables)
        shared = sum(map(len, block_tables)) - len(set().union(*block_tables))
    return (float(sum(contexts) - shared * block_size),
            longest_program_tokens(max(contexts), batch_size, kv_heads))


def longest_contexts(events: RecordedEvents, decode: bool = True) -> np.ndarray:
    """Each step's longest decode context (``decode``) or longest prefill context, from its
    scheduled rows (a decode row computes one token, a prefill row more)."""
    steps = np.asarray(events.tables["model_step"]["step"], dtype=np.int64)
    out = np.zeros(len(steps))
    scheduled = events.tables.get("seq_scheduled") or {}
    if not len(steps) or not len(scheduled.get("step", ())):
        return out
    rows_of_kind = (np.asarray(scheduled["num_new_tokens"]) == 1) == decode
    of_step = np.asarray(scheduled["step"], dtype=np.int64)[rows_of_kind]
    rows = np.minimum(np.searchsorted(steps, of_step), len(steps) - 1)
    ok = steps[rows] == of_step  # a row of a step the recording does not hold: ignored
    np.maximum.at(out, rows[ok],
                  np.asarray(scheduled["context_len"], dtype=float)[rows_of_kind][ok])
    return out
