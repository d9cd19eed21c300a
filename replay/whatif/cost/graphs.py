"""How the source run padded steps for CUDA graphs, which a simulation of another config repeats.

Decodes: padded to a captured batch size (``engine.graph_sizes.decode_graph_sizes``); larger
batches run eager. ``observed_graph_sizes`` reads the sizes off the source's steps.

Prefills (trace schema 3): a prefill step of up to ``MAX_GRAPH_PREFILL_SEQS`` prompts and at
most the largest captured token count is padded to the smallest captured count that holds it
and replayed from a graph (engine/runner/prefill_graphs.py). ``source_prefill_graphs`` takes the
captured counts from the trace header (``executor.prefill_graph_tokens``), else from the padded
counts of the source's graph prefills.

``engine.runner.prefill_graphs`` imports torch (about a second on a CPU machine): it is imported only
where a source recorded graph prefills (``prefill_graphs_module``), so a what-if run on an older
trace does not pay for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine import graph_sizes
from replay.recorded import RecordedEvents

# Header keys of the executor's description when it captured prefill graphs.
HEADER_SIZES = "prefill_graph_tokens"
HEADER_MAX_SEQS = "prefill_graph_max_seqs"


def observed_graph_sizes(events: RecordedEvents) -> list[int]:
    """The graph batch sizes the source run padded decodes to: Nano-vLLM's if it agrees with
    every observed (batch, padded) pair, else the sizes seen (a batch above them runs eager)."""
    ms = events.tables["model_step"]
    # Only decodes: a graph prefill's padded_batch_size is its own batch (it pads tokens).
    graph = np.asarray(ms["graph_used"], dtype=bool) & (np.asarray(ms["kind"]).astype(str)
                                                        == "decode")
    if not graph.any():
        return []
    seqs = np.asarray(ms["num_seqs"], dtype=np.int64)[graph]
    padded = np.asarray(ms["padded_batch_size"], dtype=np.int64)[graph]
    nano = np.asarray(graph_sizes.decode_graph_sizes())
    expected = nano[np.minimum(np.searchsorted(nano, seqs), len(nano) - 1)]
    if (expected == padded).all():
        return nano.tolist()
    return sorted(set(padded.tolist()))


def _graph_prefills(events: RecordedEvents) -> list[tuple[int, int, int]]:
    """(prompt tokens, sequences, padded tokens) of every graph prefill the source ran: its
    steps and its header's calibration steps."""
    ms = events.tables["model_step"]
    kinds = np.asarray(ms["kind"]).astype(str)
    padded = ms.get("padded_tokens")
    padded = np.zeros(len(kinds), dtype=np.int64) if padded is None else np.asarray(
        padded, dtype=np.int64)
    rows = np.flatnonzero((kinds == "prefill") & np.asarray(ms["graph_used"], dtype=bool)
                          & (padded > 0))
    tokens = np.asarray(ms["prefill_tokens"], dtype=np.int64)
    seqs = np.asarray(ms["num_seqs"], dtype=np.int64)
    out = [(int(tokens[i]), int(seqs[i]), int(padded[i])) for i in rows]
    calibration: list[Mapping[str, Any]] = events.header.get("calibration") or []
    out += [(int(row["prefill_tokens"]), int(row["num_seqs"]), int(row["padded_tokens"]))
            for row in calibration
            if row.get("kind") == "prefill" and row.get("graph_used")
            and int(row.get("padded_tokens", 0)) > 0]
    return out


def source_prefill_graphs(events: RecordedEvents) -> tuple[list[int], int]:
    """The token counts the source captured prefill graphs for (ascending) and the most
    sequences one takes; ([], 0): it captured none (or recorded none: an older trace).

    From the header where the executor described them. Else from the graph prefills it ran: the
    engine's sizes for the source's config (``prefill_graph_sizes``) where every one was padded
    as those say, else only the counts seen (a prefill above them is taken to run eager)."""
    executor = events.header.get("executor") or {}
    if executor.get(HEADER_SIZES):
        sizes = sorted(int(s) for s in executor[HEADER_SIZES])
        max_seqs = executor.get(HEADER_MAX_SEQS)
        if max_seqs is None:
            max_seqs = graph_sizes.MAX_GRAPH_PREFILL_SEQS
        return sizes, int(max_seqs)
    seen = _graph_prefills(events)
    if not seen:
        return [], 0
    config = events.header.get("config") or {}
    limit = min(int(config.get("prefill_graph_tokens", 0)),
                int(config.get("max_num_batched_tokens", 0)))
    engine_sizes = graph_sizes.prefill_graph_sizes(limit)
    max_seqs = graph_sizes.MAX_GRAPH_PREFILL_SEQS
    if all(graph_sizes.padded_prefill_tokens(engine_sizes, tokens, seqs, max_seqs) == padded
           for tokens, seqs, padded in seen):
        return engine_sizes, max_seqs
    return sorted({padded for _, _, padded in seen}), max_seqs


def restricted_sizes(sizes: Sequence[int], limit: int) -> list[int]:
    """The captured counts a config with ``min(prefill_graph_tokens, max_num_batched_tokens)``
    of ``limit`` captures of the source's (the engine captures none above either)."""
    return [size for size in sizes if size <= limit]

