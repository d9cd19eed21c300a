"""What attention reads, for the step-time model's attention features
(``features.StepFeatures.decode_kv_tokens``, ``decode_longest_tokens``,
``prefill_longest_tokens``): the paged decode kernel runs a program per sequence, KV head and
split (``engine.attention_splits``), so its last wave waits for the longest context over its
splits; a KV block that several rows of a step read (a shared prefix) comes from memory once.
The prefill kernel runs a program per query tile, sequence and KV head, each reading the keys
up to its tile: the longest reads the longest prefill context, all of it (a prompt's new tokens
over its cached prefix), however few tokens are new."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


def _per_step(events: RecordedEvents, decode: bool, value: Callable[[Any], np.ndarray],
              combine: Any) -> np.ndarray:
    """Each step's ``value`` of its decode rows (``decode``) or prefill rows (a decode row
    computes one token, a prefill row more) from its scheduled rows, folded by ``combine``
    (``np.maximum.at``, ``np.add.at``); 0 for a step without such rows."""
    steps = np.asarray(events.tables["model_step"]["step"], dtype=np.int64)
    out = np.zeros(len(steps))
    scheduled = events.tables.get("seq_scheduled") or {}
    if not len(steps) or not len(scheduled.get("step", ())):
        return out
    rows_of_kind = (np.asarray(scheduled["num_new_tokens"]) == 1) == decode
    of_step = np.asarray(scheduled["step"], dtype=np.int64)[rows_of_kind]
    rows = np.minimum(np.searchsorted(steps, of_step), len(steps) - 1)
    ok = steps[rows] == of_step  # a row of a step the recording does not hold: ignored
    combine(out, rows[ok], value(scheduled)[rows_of_kind][ok])
    return out


def longest_contexts(events: RecordedEvents, decode: bool = True) -> np.ndarray:
    """Each step's longest decode context (``decode``) or longest prefill context, from its
    scheduled rows."""
    return _per_step(events, decode, lambda rows: np.asarray(rows["context_len"], dtype=float),
                     np.maximum.at)


def prompt_squares(events: RecordedEvents) -> np.ndarray:
    """Each step's sum over its prefill rows of the new tokens squared
    (``linear.causal_work``)."""
    return _per_step(events, False,
                     lambda rows: np.asarray(rows["num_new_tokens"], dtype=float) ** 2,
                     np.add.at)


def recorded_rereads(events: RecordedEvents, block_size: int) -> np.ndarray:
    """Each step's KV tokens its decode rows read again (``shared_reads.rereads``: a block held
    by k of them read k - 1 times more), from the block events: a sequence holds a block from
    the step it was allocated or hit to the step of the next free of it (both included; never
    freed: to the end). Only a block some sequence hit (a cached prefix) can be held by two."""
    steps = np.asarray(events.tables["model_step"]["step"], dtype=np.int64)
    out = np.zeros(len(steps))
    hit = events.tables.get("block_hit") or {}
    scheduled = events.tables.get("seq_scheduled") or {}
    if not len(steps) or not len(hit.get("step", ())) or not len(scheduled.get("step", ())):
        return out
    shared = set(np.asarray(hit["block_id"]).tolist())

    def holdings(table: Mapping[str, Any]) -> dict[tuple[int, int], list[tuple[int, int]]]:
        """(seq, block) -> its (event id, step) in event order, of the shared blocks."""
        out: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for event, seq, block, step in zip(*(np.asarray(table.get(name, ())).tolist() for name
                                             in ("event_id", "seq_id", "block_id", "step"))):
            if block in shared:
                out.setdefault((seq, block), []).append((event, step))
        return out

    taken = holdings(events.tables.get("block_allocated") or {})
    for key, events_of in holdings(hit).items():
        taken.setdefault(key, []).extend(events_of)
    freed = holdings(events.tables.get("block_freed") or {})
    last_step = int(steps[-1])
    held: dict[int, list[tuple[int, int, int]]] = {}  # seq -> (block, first step, last step)
    for (seq, block), starts in taken.items():
        ends = sorted(freed.get((seq, block), []))
        for n, (_, first) in enumerate(sorted(starts)):
            held.setdefault(seq, []).append(
                (block, first, ends[n][1] if n < len(ends) else last_step))
    decode = np.asarray(scheduled["num_new_tokens"]) == 1
    rows_of: dict[int, list[int]] = {}
    for step, seq in zip(np.asarray(scheduled["step"])[decode].tolist(),
                         np.asarray(scheduled["seq_id"])[decode].tolist()):
        if seq in held:
            rows_of.setdefault(step, []).append(seq)
    at = {step: i for i, step in enumerate(steps.tolist())}
    for step, seqs in rows_of.items():
        if step not in at or len(seqs) < 2:
            continue
        blocks = [block for seq in seqs for block in {b for b, first, last in held[seq]
                                                      if first <= step <= last}]
        out[at[step]] = float((len(blocks) - len(set(blocks))) * block_size)
    return out
