"""A CUDA step in flight (:class:`LaunchedStep`), and what it needs per step: its GPU timer and
pinned host memory for its sampled tokens (one of each per step that can be in flight).

A decode step on one GPU, and a mixed step through its graph, return a :class:`LaunchedStep`
without waiting: the sampled tokens go to pinned host memory asynchronously, so the engine can
launch the next step before it reads them (``engine/runner/cuda_step.py``).
"""

from __future__ import annotations

import time

import torch

from engine.batch import StepOutput


class StepTimer:
    """GPU time of one step from two CUDA events; read after the step's tokens reached the host
    (that copy already synchronised, so reading the events costs no extra sync)."""

    def __init__(self) -> None:
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def begin(self) -> None:
        self.start.record()

    def finish(self) -> None:
        self.end.record()

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3


class TokenBuffers:
    """Pinned host buffers for sampled tokens and timers, one per step that can be in flight."""

    def __init__(self, max_rows: int, slots: int = 2) -> None:
        self.host = [
            torch.empty(max_rows, dtype=torch.int64, pin_memory=True) for _ in range(slots)
        ]
        self.timers = [StepTimer() for _ in range(slots)]
        self.turn = 0

    def next(self, rows: int) -> tuple[torch.Tensor, StepTimer]:
        self.turn = (self.turn + 1) % len(self.host)
        if rows > self.host[self.turn].numel():
            self.host[self.turn] = torch.empty(rows, dtype=torch.int64, pin_memory=True)
        return self.host[self.turn][:rows], self.timers[self.turn]


class LaunchedStep:
    """A CUDA step in flight: its sampled tokens on the device, their copy to pinned host memory
    and the step's timing events. ``result`` waits for the copy alone, not the whole device."""

    def __init__(
        self,
        seq_ids: list[int],
        tokens: torch.Tensor,
        host_tokens: torch.Tensor,
        timer: StepTimer,
        padded: int,
        graph_used: bool,
        padded_tokens: int = 0,
    ) -> None:
        self.seq_ids = seq_ids
        self.tokens = tokens
        self.row_of = {seq_id: row for row, seq_id in enumerate(seq_ids)}
        self._host = host_tokens
        self._timer = timer
        self._copied = torch.cuda.Event()
        host_tokens.copy_(tokens, non_blocking=True)
        self._copied.record()
        self._launched = StepOutput(token_ids=[], padded_batch_size=padded, graph_used=graph_used,
                                    padded_tokens=padded_tokens)
        self._output: StepOutput | None = None

    def launch_wait_s(self) -> float:
        return 0.0  # launching queued the work; ``result`` waits

    def launched_output(self) -> StepOutput:
        return self._launched

    def result(self) -> StepOutput:
        if self._output is None:
            began = time.perf_counter()
            self._copied.synchronize()
            waited = time.perf_counter() - began
            launched = self._launched
            self._output = StepOutput(
                self._host.tolist(),
                self._timer.seconds(),
                launched.padded_batch_size,
                launched.graph_used,
                waited,
                launched.padded_tokens,
            )
        return self._output
