"""The event schema: one table per event kind, its columns and types, versions and sentinels.

Every event is a row in the table of its kind. All tables share two leading columns: ``event_id``
(global, increasing in emission order, so the tables interleave back into one stream) and ``step``.
``docs/trace-format.md`` documents every column; bump ``SCHEMA_VERSION`` with any change.
"""

from __future__ import annotations

import json
from array import array
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA_VERSION = 7
# Versions this release reads. Version 1 lacks model_step.overlapped and model_step.host_s,
# version 2 model_step.padded_tokens; the reader fills them with ADDED_COLUMN_DEFAULTS (a
# version-1 run never overlapped its steps; no version-2 run padded a prefill). Version 4 changed
# what host_s holds for a step computed inside the executor's launch (docs/trace-format.md).
# Version 5 added request_finished.error (why a request was rejected; "" before),
# request_added.top_p, top_k, seed and stop (older: no such settings) and request_added.priority
# (older runs had no priorities: 0). Version 7 added model_step.outside_s (the driver's time
# between steps) and request_added.added_s (when the engine began adding it); older: NaN.
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
# model_step.padded_tokens of a step that computed its own tokens (no CUDA-graph prefill).
NOT_PADDED = 0

# Sentinel for "no hash" / "no sequence" in integer columns.
NO_HASH = -1
NO_SEQ = -1
# request_added.seed of a request without its own seed.
NO_SEED = -1

# Column name -> logical type. Types are pyarrow type names; ``list<int32>`` is a list column.
COMMON_COLUMNS: dict[str, str] = {"event_id": "int64", "step": "int32"}

EVENT_COLUMNS: dict[str, dict[str, str]] = {
    "request_added": {
        "seq_id": "int64",
        "arrival_s": "float64",
        "prompt_len": "int32",
        "prompt_token_ids": "list<int32>",
        "temperature": "float32",
        "max_tokens": "int32",
        "ignore_eos": "bool",
        "top_p": "float32",
        "top_k": "int32",
        "seed": "int64",
        "stop": "string",
        "priority": "int32",
        "added_s": "float64",
    },
    "batch_scheduled": {
        "kind": "string",
        "num_seqs": "int32",
        "num_batched_tokens": "int32",
        "num_waiting": "int32",
        "num_running": "int32",
        "free_blocks": "int32",
    },
    "seq_scheduled": {
        "seq_id": "int64",
        "num_new_tokens": "int32",
        "num_cached_tokens": "int32",
        "context_len": "int32",
    },
    "block_allocated": {
        "seq_id": "int64",
        "block_id": "int32",
        "logical_index": "int32",
        "refcount": "int32",
        "free_blocks": "int32",
    },
    "block_hit": {
        "seq_id": "int64",
        "block_id": "int32",
        "logical_index": "int32",
        "hash": "int64",
        "refcount": "int32",
        "free_blocks": "int32",
    },
    "block_hashed": {
        "seq_id": "int64",
        "block_id": "int32",
        "logical_index": "int32",
        "hash": "int64",
        "parent_hash": "int64",
    },
    "block_freed": {
        "seq_id": "int64",
        "block_id": "int32",
        "logical_index": "int32",
        "refcount": "int32",
        "free_blocks": "int32",
    },
    "preempted": {
        "seq_id": "int64",
        "blocks_released": "int32",
        "for_seq_id": "int64",
        "num_tokens": "int32",
    },
    "model_step": {
        "kind": "string",
        "duration_s": "float64",
        "num_seqs": "int32",
        "prefill_tokens": "int32",
        "prefill_attn_work": "int64",
        "decode_seqs": "int32",
        "decode_context_tokens": "int64",
        "padded_batch_size": "int32",
        "graph_used": "bool",
        "wall_time_s": "float64",
        "overlapped": "bool",
        "host_s": "float64",
        "padded_tokens": "int32",
        "outside_s": "float64",
    },
    "token_sampled": {
        "seq_id": "int64",
        "token_id": "int32",
    },
    "request_finished": {
        "seq_id": "int64",
        "reason": "string",
        "num_completion_tokens": "int32",
        "output_hash": "int64",
        "error": "string",
    },
}

EVENT_KINDS: tuple[str, ...] = tuple(EVENT_COLUMNS)

# Columns that hold measurements rather than decisions: replay never compares them.
MEASURED_COLUMNS: dict[str, frozenset[str]] = {
    "request_added": frozenset({"arrival_s", "added_s"}),
    "model_step": frozenset({"duration_s", "wall_time_s", "host_s", "outside_s"}),
}

# Columns added after schema version 1, with the value an older trace implies.
ADDED_COLUMN_DEFAULTS: dict[str, dict[str, object]] = {
    "request_added": {"top_p": 1.0, "top_k": 0, "seed": NO_SEED, "stop": "", "priority": 0,
                      "added_s": float("nan")},
    "model_step": {"overlapped": False, "host_s": float("nan"),
                   "padded_tokens": NOT_PADDED, "outside_s": float("nan")},
    "request_finished": {"error": ""},
}
# The schema version that added each column of ADDED_COLUMN_DEFAULTS (docs/trace-format.md): a
# file of an older trace never holds it (the reader refuses one that does: a header edited to an
# older version); some early version-5 traces lack the version-5 columns too (filled on reading).
ADDED_IN_VERSION: dict[str, dict[str, int]] = {
    "request_added": {"top_p": 5, "top_k": 5, "seed": 5, "stop": 5, "priority": 5,
                      "added_s": 7},
    "model_step": {"overlapped": 2, "host_s": 2, "padded_tokens": 3, "outside_s": 7},
    "request_finished": {"error": 5},
}
# Added columns whose default is not what the engine would have recorded (an older trace's
# rejections had reasons, just not stored): verify compares them only from this version on.
COMPARED_SINCE: dict[str, dict[str, int]] = {"request_finished": {"error": 5}}


def encode_stop(stop: tuple[str, ...] | list[str]) -> str:
    """request_added.stop: the stop strings as a JSON array, "" when there are none."""
    return json.dumps(list(stop), ensure_ascii=False) if stop else ""


def decode_stop(text: str) -> tuple[str, ...]:
    """The stop strings of a request_added.stop value."""
    return tuple(json.loads(text)) if text else ()


FINISH_REASONS = ("eos", "length", "stop", "aborted", "rejected")


def all_columns(kind: str) -> list[str]:
    """Every column of an event kind's table, in order."""
    return [*COMMON_COLUMNS, *EVENT_COLUMNS[kind]]


def column_types(kind: str) -> dict[str, str]:
    """Column name -> logical type name for every column of an event kind's table, in order."""
    return {**COMMON_COLUMNS, **EVENT_COLUMNS[kind]}


_ARROW_SCHEMAS: dict[str, Any] = {}


def arrow_schema(kind: str) -> pa.Schema:
    """The pyarrow schema of an event kind's table (the types of ``EVENT_COLUMNS``).

    pyarrow is imported here, not at module level, so the engine's hot import path stays light.
    """
    schema = _ARROW_SCHEMAS.get(kind)
    if schema is None:
        import pyarrow as pa

        def to_arrow(type_name: str) -> pa.DataType:
            if type_name.startswith("list<") and type_name.endswith(">"):
                return pa.list_(to_arrow(type_name[len("list<") : -1]))
            return pa.type_for_alias(type_name)

        schema = pa.schema([(name, to_arrow(t)) for name, t in column_types(kind).items()])
        _ARROW_SCHEMAS[kind] = schema
    return schema


def is_int32_array(value: object) -> bool:
    """Whether ``value`` is an ``array('i')`` of 4-byte ints: ids held as an int32 column's
    bytes (how the engine holds a prompt, engine/prompt_ids.py), which every int32 check and
    copy may take as a buffer."""
    return isinstance(value, array) and value.typecode == "i" and value.itemsize == 4
