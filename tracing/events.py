"""The columnar buffer the engine writes events into (the schema: ``tracing/schema.py``).

Rows are appended column by column into plain Python lists; nothing allocates a Python object per
event, which keeps recording cheap at hundreds of sequences per step.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from tracing.schema import EVENT_KINDS, NO_SEED, NOT_PADDED, all_columns, is_int32_array


class EventBuffer:
    """Columnar, append-only store of the events of one run (or of one segment of it).

    The engine calls the typed ``emit_*`` methods; sinks read ``tables`` (column name -> list) and
    may ``drain`` the buffer after writing a segment. ``next_event_id`` keeps counting across
    drains, so ids stay global over the whole run.
    """

    def __init__(self, first_event_id: int = 0) -> None:
        self.next_event_id = first_event_id
        self.step = 0
        # False: ``request_added`` rows hold None for ``prompt_token_ids`` (the prompt is not
        # copied), for a sink that reads no prompt tokens (``EventSink.needs_prompt_tokens``).
        self.keep_prompt_tokens = True
        self.tables: dict[str, dict[str, list]] = {}
        self._reset_tables()

    def _reset_tables(self) -> None:
        self.tables = {kind: {col: [] for col in all_columns(kind)} for kind in EVENT_KINDS}
        t = self.tables
        # Bound list appenders for the hot paths: one attribute lookup per column, not three.
        self._ra = t["request_added"]
        self._bs = t["batch_scheduled"]
        self._ss = t["seq_scheduled"]
        self._ba = t["block_allocated"]
        self._bh = t["block_hit"]
        self._bx = t["block_hashed"]
        self._bf = t["block_freed"]
        self._pe = t["preempted"]
        self._ms = t["model_step"]
        self._ts = t["token_sampled"]
        self._rf = t["request_finished"]

    def num_events(self) -> int:
        return sum(len(cols["event_id"]) for cols in self.tables.values())

    def counts(self) -> dict[str, int]:
        return {kind: len(cols["event_id"]) for kind, cols in self.tables.items()}

    def drain(self) -> dict[str, dict[str, list]]:
        """Return the buffered tables and start empty ones (event ids keep counting)."""
        out = self.tables
        self._reset_tables()
        return out

    # --- emission -------------------------------------------------------------------------------
    def _id(self, table: dict[str, list]) -> None:
        """Give the row being appended to ``table`` the next event id and the current step."""
        table["event_id"].append(self.next_event_id)
        self.next_event_id += 1
        table["step"].append(self.step)

    def _ids(self, table: dict[str, list], n: int) -> None:
        first = self.next_event_id
        self.next_event_id = first + n
        table["event_id"].extend(range(first, first + n))
        table["step"].extend([self.step] * n)

    def emit_request_added(
        self,
        seq_id: int,
        arrival_s: float,
        prompt_token_ids: Sequence[int],
        temperature: float,
        max_tokens: int,
        ignore_eos: bool,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = NO_SEED,
        stop: str = "",
        priority: int = 0,
        added_s: float = float("nan"),
    ) -> None:
        """A request entered the engine; ``stop`` is ``schema.encode_stop`` of its strings;
        ``added_s``: when the engine began adding it (``arrival_s`` may be the workload's)."""
        t = self._ra
        self._id(t)
        t["seq_id"].append(seq_id)
        t["arrival_s"].append(arrival_s)
        t["prompt_len"].append(len(prompt_token_ids))
        t["prompt_token_ids"].append(_prompt_copy(prompt_token_ids) if self.keep_prompt_tokens
                                     else None)
        t["temperature"].append(temperature)
        t["max_tokens"].append(max_tokens)
        t["ignore_eos"].append(ignore_eos)
        t["top_p"].append(top_p)
        t["top_k"].append(top_k)
        t["seed"].append(seed)
        t["stop"].append(stop)
        t["priority"].append(priority)
        t["added_s"].append(added_s)

    def emit_batch(
        self,
        kind: str,
        num_batched_tokens: int,
        num_waiting: int,
        num_running: int,
        free_blocks: int,
        seq_ids: list[int],
        num_new_tokens: list[int],
        num_cached_tokens: list[int],
        context_lens: list[int],
    ) -> None:
        """One ``batch_scheduled`` row followed by one ``seq_scheduled`` row per sequence."""
        b = self._bs
        self._id(b)
        b["kind"].append(kind)
        b["num_seqs"].append(len(seq_ids))
        b["num_batched_tokens"].append(num_batched_tokens)
        b["num_waiting"].append(num_waiting)
        b["num_running"].append(num_running)
        b["free_blocks"].append(free_blocks)
        s = self._ss
        self._ids(s, len(seq_ids))
        s["seq_id"].extend(seq_ids)
        s["num_new_tokens"].extend(num_new_tokens)
        s["num_cached_tokens"].extend(num_cached_tokens)
        s["context_len"].extend(context_lens)

    def emit_blocks_allocated(
        self, seq_id: int, block_ids: list[int], logical_indices: Iterable[int],
        free_blocks: list[int]
    ) -> None:
        """Fresh blocks (refcount 1) given to one sequence in turn: a ``block_allocated`` row
        each, ``free_blocks`` counted after each."""
        t = self._ba
        self._ids(t, len(block_ids))
        t["seq_id"].extend([seq_id] * len(block_ids))
        t["block_id"].extend(block_ids)
        t["logical_index"].extend(logical_indices)
        t["refcount"].extend([1] * len(block_ids))
        t["free_blocks"].extend(free_blocks)

    def emit_block_hit(
        self,
        seq_id: int,
        block_id: int,
        logical_index: int,
        block_hash: int,
        refcount: int,
        free_blocks: int,
    ) -> None:
        t = self._bh
        self._id(t)
        t["seq_id"].append(seq_id)
        t["block_id"].append(block_id)
        t["logical_index"].append(logical_index)
        t["hash"].append(block_hash)
        t["refcount"].append(refcount)
        t["free_blocks"].append(free_blocks)

    def emit_block_hashed(
        self, seq_id: int, block_id: int, logical_index: int, block_hash: int, parent_hash: int
    ) -> int:
        """Append a block entering the prefix cache; returns its row (``patch_block_hash``)."""
        t = self._bx
        row = len(t["event_id"])
        self._id(t)
        t["seq_id"].append(seq_id)
        t["block_id"].append(block_id)
        t["logical_index"].append(logical_index)
        t["hash"].append(block_hash)
        t["parent_hash"].append(parent_hash)
        return row

    def emit_blocks_freed(
        self,
        seq_id: int,
        block_ids: list[int],
        logical_indices: list[int],
        refcounts: list[int],
        free_blocks: list[int],
    ) -> None:
        """The release of a sequence's block references, in release order."""
        t = self._bf
        self._ids(t, len(block_ids))
        t["seq_id"].extend([seq_id] * len(block_ids))
        t["block_id"].extend(block_ids)
        t["logical_index"].extend(logical_indices)
        t["refcount"].extend(refcounts)
        t["free_blocks"].extend(free_blocks)

    def emit_preempted(
        self, seq_id: int, blocks_released: int, for_seq_id: int, num_tokens: int
    ) -> None:
        t = self._pe
        self._id(t)
        t["seq_id"].append(seq_id)
        t["blocks_released"].append(blocks_released)
        t["for_seq_id"].append(for_seq_id)
        t["num_tokens"].append(num_tokens)

    def emit_model_step(
        self,
        kind: str,
        duration_s: float,
        num_seqs: int,
        prefill_tokens: int,
        prefill_attn_work: int,
        decode_seqs: int,
        decode_context_tokens: int,
        padded_batch_size: int,
        graph_used: bool,
        wall_time_s: float,
        overlapped: bool = False,
        host_s: float = 0.0,
        padded_tokens: int = NOT_PADDED,
        outside_s: float = 0.0,
    ) -> int:
        """Append a model step; returns its row (see ``patch_model_step``)."""
        t = self._ms
        row = len(t["event_id"])
        self._id(t)
        t["kind"].append(kind)
        t["duration_s"].append(duration_s)
        t["num_seqs"].append(num_seqs)
        t["prefill_tokens"].append(prefill_tokens)
        t["prefill_attn_work"].append(prefill_attn_work)
        t["decode_seqs"].append(decode_seqs)
        t["decode_context_tokens"].append(decode_context_tokens)
        t["padded_batch_size"].append(padded_batch_size)
        t["graph_used"].append(graph_used)
        t["wall_time_s"].append(wall_time_s)
        t["overlapped"].append(overlapped)
        t["host_s"].append(host_s)
        t["padded_tokens"].append(padded_tokens)
        t["outside_s"].append(outside_s)
        return row

    def emit_tokens_sampled(self, seq_ids: list[int], token_ids: list[int]) -> int:
        """Append sampled tokens; returns the first row (see ``patch_tokens``)."""
        t = self._ts
        row = len(t["event_id"])
        self._ids(t, len(seq_ids))
        t["seq_id"].extend(seq_ids)
        t["token_id"].extend(token_ids)
        return row

    def emit_request_finished(
        self, seq_id: int, reason: str, num_completion_tokens: int, output_hash: int
    ) -> int:
        """Append a finished request; returns its row (see ``patch_output_hash``)."""
        t = self._rf
        row = len(t["event_id"])
        self._id(t)
        t["seq_id"].append(seq_id)
        t["reason"].append(reason)
        t["num_completion_tokens"].append(num_completion_tokens)
        t["output_hash"].append(output_hash)
        t["error"].append("")
        return row

    # --- deferred values ------------------------------------------------------------------------
    # An overlapped step (engine/engine_core.py) emits its events in their final order before its
    # tokens are back from the device, with placeholder values, and fills them in here before
    # the buffer is drained. Rows are indices into the current (undrained) tables.
    def reserve_ids(self, count: int) -> int:
        """Hand out ``count`` consecutive event ids for rows ``extend_rows`` appends later (a
        caller that builds many rows at once); returns the first."""
        first = self.next_event_id
        self.next_event_id = first + count
        return first

    def extend_rows(self, kind: str, columns: dict[str, list]) -> None:
        """Append rows of ``kind`` given column by column: every column of its table (ids from
        ``reserve_ids``), each the same length."""
        table = self.tables[kind]
        if columns.keys() != table.keys() or len({len(v) for v in columns.values()}) > 1:
            raise ValueError(f"{kind}: rows need the columns {list(table)}, of one length")
        for name, values in columns.items():
            table[name].extend(values)

    def patch_model_step(
        self, row: int, duration_s: float, wall_time_s: float, host_s: float
    ) -> None:
        t = self._ms
        t["duration_s"][row] = duration_s
        t["wall_time_s"][row] = wall_time_s
        t["host_s"][row] = host_s

    def patch_tokens(self, first_row: int, token_ids: list[int]) -> None:
        self._ts["token_id"][first_row : first_row + len(token_ids)] = token_ids

    def patch_output_hash(self, row: int, output_hash: int) -> None:
        self._rf["output_hash"][row] = output_hash

    def patch_block_hash(self, row: int, block_hash: int) -> None:
        self._bx["hash"][row] = block_hash

    def patch_last_rejection(self, error: str) -> None:
        """Give the request just rejected (the last ``request_finished`` row) its reason."""
        self._rf["error"][-1] = error


class NullEventBuffer(EventBuffer):
    """Accepts every event and keeps none: the engine with recording switched off."""

    def _noop(self, *args: object, **kwargs: object) -> None:
        return None

    emit_request_added = _noop  # type: ignore[assignment]
    emit_batch = _noop  # type: ignore[assignment]
    emit_blocks_allocated = _noop  # type: ignore[assignment]
    emit_block_hit = _noop  # type: ignore[assignment]
    emit_block_hashed = _noop  # type: ignore[assignment]
    emit_blocks_freed = _noop  # type: ignore[assignment]
    emit_preempted = _noop  # type: ignore[assignment]
    emit_model_step = _noop  # type: ignore[assignment]
    emit_tokens_sampled = _noop  # type: ignore[assignment]
    emit_request_finished = _noop  # type: ignore[assignment]
    patch_model_step = _noop  # type: ignore[assignment]
    patch_tokens = _noop  # type: ignore[assignment]
    patch_output_hash = _noop  # type: ignore[assignment]
    patch_block_hash = _noop  # type: ignore[assignment]
    patch_last_rejection = _noop  # type: ignore[assignment]
    extend_rows = _noop  # type: ignore[assignment]


def _prompt_copy(prompt_token_ids: Sequence[int]) -> array | list[int]:
    """The event's own copy of a prompt (the sequence's buffer grows as it decodes): an int32
    array copied as bytes (``tracing.convert`` then hands a segment's prompts to Arrow as one
    buffer), else a list."""
    if is_int32_array(prompt_token_ids):
        return array("i", prompt_token_ids)
    return list(prompt_token_ids)
