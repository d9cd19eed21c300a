"""Run a workload on a live engine, letting requests arrive at their recorded times."""

from __future__ import annotations

import time
from typing import Any

from tqdm.auto import tqdm

from engine.drive import drive
from engine.engine_core import EngineCore, StepResult
from engine.llm import LLMEngine
from engine.sequence import Sequence
from replay.workloads.builtin import Request

IDLE_POLL_S = 0.001


class _ArrivingRequests:
    """Workload requests, each due ``arrival_s`` seconds after the run starts."""

    def __init__(self, llm: LLMEngine, requests: list[Request], start: float, bar: Any) -> None:
        self.llm, self.requests, self.start, self.bar = llm, requests, start, bar
        self.order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i))
        self.seqs: list[Sequence | None] = [None] * len(requests)
        self.cursor = 0

    def feed(self, core: EngineCore, now: float) -> None:
        order, requests = self.order, self.requests
        while self.cursor < len(order) and requests[order[self.cursor]].arrival_s <= now:
            index = order[self.cursor]
            request = requests[index]
            seq = self.llm.add_request(request.prompt, request.sampling_params(),
                                       arrival_s=self.start + request.arrival_s,
                                       priority=request.priority)
            self.seqs[index] = seq
            if self.llm.rejection(seq) is not None:
                self.bar.update(1)
            self.cursor += 1

    def next_due(self) -> float | None:
        if self.cursor >= len(self.order):
            return None
        return self.requests[self.order[self.cursor]].arrival_s

    def on_result(self, result: StepResult, now: float) -> None:
        self.bar.update(len(result.finished))


def run_workload(llm: LLMEngine, requests: list[Request], use_tqdm: bool = True) -> list[Sequence]:
    """Submit each request once the run's clock passes its ``arrival_s``; step until all finish.

    Returns the sequences in workload order. All-zero arrivals make an offline batch.
    """
    core = llm.core
    start = core.now()
    bar = tqdm(total=len(requests), desc="run", disable=not use_tqdm, dynamic_ncols=True)
    inputs = _ArrivingRequests(llm, requests, start, bar)

    def now() -> float:
        return core.now() - start

    def wait_until(due: float) -> None:
        time.sleep(min(max(due - now(), 0.0), IDLE_POLL_S * 100))

    drive(core, inputs, now, wait_until)
    bar.close()
    return [seq for seq in inputs.seqs if seq is not None]
