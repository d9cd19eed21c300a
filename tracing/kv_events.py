"""KV-cache events in vLLM's format, for KV-aware routers (llm-d, Dynamo), from any trace or live.

vLLM publishes, per engine step, an ``EventBatch`` ``{"ts", "events", "data_parallel_rank"}``
whose events are maps tagged by ``"type"`` (the map form vLLM adopted in 2026, its msgspec
structs without ``array_like``): ``BlockStored`` (block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, lora_name), ``BlockRemoved`` (block_hashes, medium) and
``AllBlocksCleared``. Over ZMQ each batch is a three-frame message: topic, an 8-byte big-endian
sequence number, the msgpack payload.

From the trace the translator keeps the hashes the engine's prefix cache can hit, as the engine
does. With the header's ``config.prefix_cache_duplicates`` (the default since it exists) every
block holding a hash serves it (``engine/cache_copies.py``): a ``block_hashed`` row adds its
block to the hash's holders, a ``block_allocated`` row hands a block out fresh and takes it away
from them; a hash is stored when its first holder comes and removed when its last one goes.
Without it (older traces) the engine indexes one block per hash (``BlockManager``'s
``hash_to_block_id``): a ``block_hashed`` row's block becomes the hash's indexed block when none
is, or when the indexed one is free (refcounts from ``block_allocated``, ``block_hit`` and
``block_freed``), and a hash is stored when it enters the index and removed when it leaves it,
which a handed-out indexed block does even while a duplicate (the same tokens filled by another
sequence) holds it. Either way a router holds exactly the hashes the engine can hit at the end
of each step. A block's tokens come from its sequence's prompt and sampled tokens. Hashes are
the trace's xxhash64 chain, published unsigned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tracing.errors import TraceError
from tracing.events import EventBuffer
from tracing.layout import KV_EXPORT_FILE
from tracing.schema import NO_HASH

MEDIUM = "GPU"
_U64 = (1 << 64) - 1
# The columns each kind contributes, in the order they are read.
_READ = {
    "request_added": ("seq_id", "prompt_token_ids"),
    "token_sampled": ("seq_id", "token_id"),
    "block_hashed": ("seq_id", "block_id", "logical_index", "hash", "parent_hash"),
    "block_allocated": ("block_id",),
    "block_hit": ("block_id", "refcount"),
    "block_freed": ("block_id", "refcount"),
    "request_finished": ("seq_id",),
}


def external_hash(value: int) -> int:
    """A trace hash (signed int64 bits) as vLLM publishes block hashes (unsigned)."""
    return int(value) & _U64


def all_blocks_cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def event_batch(ts: float, events: list[dict[str, Any]], rank: int = 0) -> dict[str, Any]:
    return {"ts": ts, "events": events, "data_parallel_rank": rank}


def keeps_duplicates(header: dict[str, Any]) -> bool:
    """Whether the engine that wrote ``header`` served a hash from every block holding it
    (``config.prefix_cache_duplicates``; absent from headers recorded before it: one block)."""
    config = header.get("config")
    return bool(config.get("prefix_cache_duplicates", False)) if isinstance(config, dict) else False


class KVEventTranslator:
    """Turns a run's events, in event-id order, into vLLM KV events.

    Keeps the tokens of running requests (dropped when they finish), the engine's prefix-cache
    index (hash -> the block the engine serves it from; with ``keep_duplicates``, hash -> how
    many blocks hold it), the hash each block holds and each block's refcount: bounded by the
    pool and the running requests, whatever the run's length.
    """

    def __init__(self, block_size: int, keep_duplicates: bool = False) -> None:
        self.block_size = block_size
        self.keep_duplicates = keep_duplicates
        self.tokens: dict[int, list[int]] = {}
        self.index: dict[int, int] = {}  # hash -> the block the prefix cache serves it from
        self.holders: dict[int, int] = {}  # hash -> blocks holding it (``keep_duplicates``)
        self.block_hash: dict[int, int] = {}  # block -> the hash it holds
        self.refcount: dict[int, int] = {}  # block -> references (0 or absent: free)

    def translate(self, rows: Iterator[tuple[str, tuple]]) -> list[dict[str, Any]]:
        """vLLM events for ``rows`` ((kind, values of ``_READ[kind]``), in event-id order)."""
        out: list[dict[str, Any]] = []
        for kind, values in rows:
            if kind == "token_sampled":
                tokens = self.tokens.get(values[0])
                if tokens is not None:
                    tokens.append(int(values[1]))
            elif kind == "block_hashed":
                self._stored(out, *values)
            elif kind == "block_allocated":
                self._handed_out(out, int(values[0]))
            elif kind in ("block_hit", "block_freed"):
                self.refcount[int(values[0])] = int(values[1])
            elif kind == "request_added":
                self.tokens[int(values[0])] = [int(t) for t in values[1]]
            elif kind == "request_finished":
                self.tokens.pop(int(values[0]), None)
        return out

    def _stored(self, out: list, seq_id: int, block_id: int, index: int, block_hash: int,
                parent: int) -> None:
        """``BlockManager._enter``: the block holds the hash; the index takes it when it has no
        block for the hash or its block is free (a live one keeps serving it); with
        ``keep_duplicates`` the block joins the hash's holders. Stored: the hash's first."""
        block_hash, block_id = int(block_hash), int(block_id)
        if block_hash == NO_HASH:  # never entered (its value never came)
            return
        self.block_hash[block_id] = block_hash
        if self.keep_duplicates:
            count = self.holders.get(block_hash, 0)
            self.holders[block_hash] = count + 1
            if count:  # already stored
                return
        else:
            held = self.index.get(block_hash)
            if held is not None and self.refcount.get(held, 0) > 0:
                return
            self.index[block_hash] = block_id
            if held is not None:  # served from this block now: a router sees no change
                return
        size = self.block_size
        tokens = self.tokens.get(int(seq_id), [])[int(index) * size : (int(index) + 1) * size]
        out.append({
            "type": "BlockStored",
            "block_hashes": [external_hash(block_hash)],
            "parent_block_hash": None if int(parent) == NO_HASH else external_hash(parent),
            "token_ids": tokens,
            "block_size": size,
            "lora_id": None,
            "medium": MEDIUM,
            "lora_name": None,
        })

    def _handed_out(self, out: list, block_id: int) -> None:
        """``BlockManager._forget_contents``: a block handed out fresh forgets its hash, which
        leaves the index only if this was its indexed block (with ``keep_duplicates``: its last
        holder)."""
        self.refcount[block_id] = 1
        old = self.block_hash.pop(block_id, None)
        if old is None:
            return
        if self.keep_duplicates:
            self.holders[old] -= 1
            if self.holders[old]:
                return
            del self.holders[old]
        else:
            if self.index.get(old) != block_id:
                return
            del self.index[old]
        out.append({"type": "BlockRemoved", "block_hashes": [external_hash(old)],
                    "medium": MEDIUM})


def translator_for(header: dict[str, Any], where: Any = "run.json") -> KVEventTranslator:
    """The translator for the run ``header`` describes; ``TraceError`` naming ``where`` when
    it gives no block size (``tracing.inspect.header_block_size``): a block's token ids are
    cut from its sequence by it."""
    from tracing.inspect import header_block_size

    size = header_block_size(header)
    if size is None:
        raise TraceError(f"{where}: its header gives no block size (block_size or "
                         "config.kvcache_block_size): cannot cut the KV blocks' token ids")
    return KVEventTranslator(size, keeps_duplicates(header))


def _merged_rows(tables: dict[str, dict[str, Any]], start: dict[str, int]) -> Iterator:
    """Rows of the read kinds from ``start[kind]`` on, merged by event id."""
    rows = []
    for kind, names in _READ.items():
        cols = tables[kind]
        ids = cols["event_id"]
        first = start.get(kind, 0)
        columns = [cols[n] for n in names]
        rows += [(ids[i], kind, tuple(c[i] for c in columns)) for i in range(first, len(ids))]
    rows.sort(key=lambda r: r[0])
    return ((kind, values) for _, kind, values in rows)


class KVEventTap:
    """An ``EventSink`` that turns each step's new events into one vLLM ``EventBatch`` for
    ``publish`` before handing the buffer to ``inner`` (the recorder), or draining it when
    there is none. It only reads the buffer."""

    def __init__(self, inner: Any, publish: Callable[[dict[str, Any]], None]) -> None:
        self.inner, self.publish = inner, publish
        self.translator: KVEventTranslator | None = None
        self._tables: dict | None = None
        self._cursor: dict[str, int] = {}

    def open(self, header: dict[str, Any]) -> None:
        self.translator = translator_for(header)
        if self.inner is not None:
            self.inner.open(header)
        self.publish(event_batch(time.time(), [all_blocks_cleared()]))  # a fresh, empty pool

    def _read(self, buffer: EventBuffer) -> None:
        assert self.translator is not None, "open() first"
        if buffer.tables is not self._tables:  # drained since: start over on the new tables
            self._tables, self._cursor = buffer.tables, {}
        events = self.translator.translate(_merged_rows(buffer.tables, self._cursor))
        self._cursor = {kind: len(buffer.tables[kind]["event_id"]) for kind in _READ}
        if events:
            self.publish(event_batch(time.time(), events))

    def on_step_end(self, buffer: EventBuffer) -> None:
        self._read(buffer)
        if self.inner is not None:
            self.inner.on_step_end(buffer)
        else:
            buffer.drain()

    def close(self, buffer: EventBuffer, summary: dict[str, Any]) -> None:
        self._read(buffer)
        if self.inner is not None:
            self.inner.close(buffer, summary)
        else:
            buffer.drain()


def trace_kv_batches(trace: Any) -> Iterator[dict[str, Any]]:
    """One ``EventBatch`` per step of a trace that stored or removed blocks (after a first
    ``AllBlocksCleared``), stamped with the step's end on the run's clock (Unix seconds)."""
    header = trace.header
    translator = translator_for(header, getattr(trace, "path", "run.json"))
    start = _start_unix(header)
    tables = {kind: trace.columns(kind) for kind in _READ}
    ends = dict(zip(trace.columns("model_step")["step"].tolist(),
                    trace.columns("model_step")["wall_time_s"].tolist()))
    yield event_batch(start, [all_blocks_cleared()])
    by_step: dict[int, list] = {}
    for kind, names in _READ.items():
        cols = tables[kind]
        for i, (event_id, step) in enumerate(zip(cols["event_id"], cols["step"])):
            by_step.setdefault(int(step), []).append(
                (int(event_id), kind, tuple(cols[n][i] for n in names)))
    for step in sorted(by_step):
        rows = sorted(by_step[step], key=lambda r: r[0])
        events = translator.translate((kind, values) for _, kind, values in rows)
        if events:
            yield event_batch(start + float(ends.get(step, ends.get(step - 1, 0.0))), events)


def _start_unix(header: dict[str, Any]) -> float:
    """The run's start (the header's ISO 8601 ``start_time``) in Unix seconds; 0 if unknown."""
    from datetime import datetime, timezone

    try:
        started = datetime.strptime(str(header.get("start_time")), "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return 0.0
    return started.replace(tzinfo=timezone.utc).timestamp()


def export_kv_events(trace: Any, out_path: str | Path, force: bool = False) -> tuple[Path, int]:
    """Write a trace's KV events as a stream of msgpack ``EventBatch`` maps (one per step; read
    them back with ``msgpack.Unpacker``); returns the path and the number of events.

    Where it may be written is ``export``'s rule (``tracing.export.check_export_path``: inside
    the trace only as ``KV_EXPORT_FILE``; an existing file only an earlier KV export, or with
    ``force``), checked before any work; the file is written whole or not at all."""
    from tracing.export import check_export_path
    from tracing.outdir import create_exclusive
    from tracing.outfile import write_via_temporary

    try:
        import msgpack
    except ImportError:
        raise TraceError("exporting vLLM KV events needs msgpack (pip install msgpack)") from None
    out = Path(out_path)
    check_export_path(trace, out, force, KV_EXPORT_FILE, _is_kv_export)
    count = 0

    def write(tmp: Path) -> None:  # streamed: memory stays bounded by one step's batch
        nonlocal count
        with open(create_exclusive(tmp), "wb") as handle:
            for batch in trace_kv_batches(trace):
                handle.write(msgpack.packb(batch))
                count += len(batch["events"])

    write_via_temporary(out, write)
    return out, count


def _is_kv_export(path: Path) -> bool:
    """Whether ``path`` starts as ``export_kv_events`` writes: a msgpack map of a few keys whose
    first is "ts" (``event_batch``), or is empty (a trace without KV events)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head == b"" or (len(head) == 4 and head[0] & 0xF0 == 0x80 and head[1:] == b"\xa2ts")
