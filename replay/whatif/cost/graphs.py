"""The CUDA graphs of a source run: the decode batch sizes and prefill token counts it padded
steps to, so a simulation pads its steps as the source's engine did (the rule:
``engine.graph_sizes``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from engine import graph_sizes
from replay.recorded import RecordedEvents
from replay.whatif.cost.features import PADDED_TOKENS


def observed_graph_sizes(events: RecordedEvents) -> list[int]:
    """The graph batch sizes the source run padded decodes to: the engine's if they agree with
    every observed (batch, padded) pair, else the sizes seen (a batch above them runs eager)."""
    ms = events.tables["model_step"]
    # Only decodes: a graph prefill's padded_batch_size is its own batch (it pads tokens).
    graph = np.asarray(ms["graph_used"], dtype=bool) & (np.asarray(ms["kind"]).astype(str)
                                                        == "decode")
    if not graph.any():
        return []
    seqs = np.asarray(ms["num_seqs"], dtype=np.int64)[graph]
    padded = np.asarray(ms["padded_batch_size"], dtype=np.int64)[graph]
    engine = graph_sizes.decode_graph_sizes()
    if all(graph_sizes.padded_decode_size(engine, int(s)) == p for s, p in zip(seqs, padded)):
        return engine
    return sorted(set(padded.tolist()))


def _graph_prefills(events: RecordedEvents) -> list[tuple[int, int, int]]:
    """(prompt tokens, sequences, padded tokens) of every graph prefill the source ran: its
    steps and its header's calibration steps."""
    ms = events.tables["model_step"]
    kinds = np.asarray(ms["kind"]).astype(str)
    padded = np.asarray(ms.get(PADDED_TOKENS, np.zeros(len(kinds))), dtype=np.int64)
    rows = np.flatnonzero((kinds == "prefill") & np.asarray(ms["graph_used"], dtype=bool)
                          & (padded > 0))
    tokens = np.asarray(ms["prefill_tokens"], dtype=np.int64)
    seqs = np.asarray(ms["num_seqs"], dtype=np.int64)
    out = [(int(tokens[i]), int(seqs[i]), int(padded[i])) for i in rows]
    calibration: list[Mapping[str, Any]] = events.header.get("calibration") or []
    out += [(int(row["prefill_tokens"]), int(row["num_seqs"]), int(row[PADDED_TOKENS]))
            for row in calibration
            if row.get("kind") == "prefill" and row.get("graph_used")
            and int(row.get(PADDED_TOKENS, 0)) > 0]
    return out


def source_prefill_graphs(events: RecordedEvents) -> tuple[list[int], int]:
    """The token counts the source captured prefill graphs for (ascending) and the most
    sequences one takes; ([], 0): it captured none (or recorded none: an older trace).

    From the header where the executor described them. Else from the graph prefills it ran: the
    engine's sizes for the source's config where every one was padded as those say, else only
    the counts seen (a prefill above them is taken to run eager)."""
    executor = events.header.get("executor") or {}
    max_seqs = graph_sizes.LEGACY_PREFILL_GRAPH_SEQS
    if executor.get("prefill_graph_tokens"):  # as the runner describes its prefill graphs
        sizes = sorted(int(s) for s in executor["prefill_graph_tokens"])
        described = executor.get("prefill_graph_max_seqs")
        return sizes, int(max_seqs if described is None else described)
    seen = _graph_prefills(events)
    if not seen:
        return [], 0
    config = events.header.get("config") or {}
    limit = min(int(config.get("prefill_graph_tokens", 0)),
                int(config.get("max_num_batched_tokens", 0)))
    engine_sizes = graph_sizes.prefill_graph_sizes(limit)
    if all(graph_sizes.padded_prefill_tokens(engine_sizes, tokens, seqs, max_seqs) == padded
           for tokens, seqs, padded in seen):
        return engine_sizes, max_seqs
    return sorted({padded for _, _, padded in seen}), max_seqs
