"""CUDA graphs captured per size over fixed input buffers, sharing one memory pool.

Used for decode batches (``engine/runner/decode_graphs.py``) and prefill token counts
(``engine/runner/prefill_graphs.py``): the caller stages inputs into buffers whose addresses never
change, then replays the graph of the padded size; hidden states land in ``outputs[:size]``.
Both stage their int64 inputs as rows of one block (``ROW_*``); padding rows get ``PAD_SLOT``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.model.attention_metadata import AttentionMetadata

# A padding row's cache slot: the KV store skips it, so padding never writes the cache.
PAD_SLOT = -1
# A row's source when its input token is on the host (see ``take_sources``).
NO_SOURCE = -1
# Rows of the int64 staging block both graph kinds share: token ids, positions, cache slots
# (each kind adds its own rows after these).
ROW_IDS, ROW_POSITIONS, ROW_SLOTS = 0, 1, 2
# The forward a graph captures: model(input_ids, positions, metadata) -> hidden states.
ModelFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


def take_sources(ids: torch.Tensor, sources: torch.Tensor, previous_tokens: torch.Tensor) -> None:
    """Input ids of rows with a source (``sources[row]``: the row of ``previous_tokens``, the
    previous step's sampled tokens, holding this row's input; ``NO_SOURCE``: keep ``ids[row]``),
    read on the device (stream order puts it after that step's sampler), never through the
    host."""
    taken = previous_tokens.index_select(0, sources.clamp(min=0))
    torch.where(sources >= 0, taken, ids, out=ids)


class CapturedGraphs:
    """One CUDA graph per size; ``outputs`` ``[max rows, hidden]`` receives every graph's rows.

    A size is a row count, or any sortable key whose row count ``rows`` says (mixed steps:
    ``(prefill tokens, decode rows)``)."""

    def __init__(self, sizes: Sequence[int], outputs: torch.Tensor) -> None:
        self.sizes = sorted(sizes)
        self.outputs = outputs
        self.graphs: dict[Any, Any] = {}
        self.pool: Any = None

    def capture_all(self, forward_of: Callable[[int], Callable[[], torch.Tensor]]) -> None:
        """Capture ``forward_of(size)()`` for every size, largest first (so the first graph sizes
        the shared pool), each after one eager run of the same call (Triton compiles there, not
        during capture)."""
        for size in reversed(self.sizes):
            forward = forward_of(size)
            rows = self.rows(size)
            self.outputs[:rows] = forward()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, self.pool):
                self.outputs[:rows] = forward()
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def rows(self, size: Any) -> int:
        """The rows graph ``size`` computes."""
        return int(size)

    def replay(self, size: Any) -> torch.Tensor:
        """Run the graph of ``size`` over the staged inputs; hidden states ``[rows, hidden]``."""
        self.graphs[size].replay()
        return self.outputs[: self.rows(size)]

    def release(self) -> None:
        self.graphs.clear()
        self.pool = None
