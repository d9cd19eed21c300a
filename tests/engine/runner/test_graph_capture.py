"""The capture loop shared by decode and prefill CUDA graphs, on CPU with a stand-in for CUDA.

``torch.cuda.CUDAGraph``/``graph``/``synchronize`` are replaced by fakes that record what the
loop does: sizes captured largest first, each after one eager run of the same forward, every
graph after the first capturing into the first graph's memory pool; a replay runs that size's
graph and returns its rows of the shared output. (The real capture runs on the GPU:
``test_gpu_runner.py``.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from engine.runner.graph_capture import CapturedGraphs

POOL = "pool-of-the-first-graph"


class _FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def pool(self) -> str:
        return POOL

    def replay(self) -> None:
        self.replays += 1


def test_sizes_are_captured_largest_first_into_one_pool(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pools: list[object] = []
    events: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def fake_graph(graph: _FakeGraph, pool: object = None) -> Iterator[None]:
        pools.append(pool)
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    graphs = CapturedGraphs([4, 1, 2], torch.zeros(4, 3))

    def forward_of(size: int):  # type: ignore[no-untyped-def]
        events.append(("built", size))

        def forward() -> torch.Tensor:
            events.append(("ran", size))
            return torch.full((size, 3), float(size))

        return forward

    graphs.capture_all(forward_of)
    assert events == [("built", 4), ("ran", 4), ("ran", 4), ("built", 2), ("ran", 2), ("ran", 2),
                      ("built", 1), ("ran", 1), ("ran", 1)]
    assert pools == [None, POOL, POOL]
    assert sorted(graphs.graphs) == [1, 2, 4]
    out = graphs.replay(2)
    assert graphs.graphs[2].replays == 1 and out.shape == (2, 3)
    assert out.data_ptr() == graphs.outputs.data_ptr()  # a view of the shared output
    graphs.release()
    assert graphs.graphs == {} and graphs.pool is None
