"""Run a workload on a live engine, letting requests arrive at their recorded times."""

from __future__ import annotations

import time

from tqdm.auto import tqdm

from engine.llm import LLMEngine
from engine.sequence import Sequence
from replay.workloads.builtin import Request

IDLE_POLL_S = 0.001


def run_workload(llm: LLMEngine, requests: list[Request], use_tqdm: bool = True) -> list[Sequence]:
    """Submit each request once the run's clock passes its ``arrival_s``; step until all finish.

    Returns the sequences in workload order. All-zero arrivals make an offline batch.
    """
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i))
    seqs: list[Sequence | None] = [None] * len(requests)
    core = llm.core
    start = core.now()
    cursor = 0
    bar = tqdm(total=len(requests), desc="run", disable=not use_tqdm, dynamic_ncols=True)
    while True:
        now = core.now() - start
        while cursor < len(order) and requests[order[cursor]].arrival_s <= now:
            index = order[cursor]
            request = requests[index]
            seqs[index] = llm.add_request(
                request.prompt, request.sampling_params(), arrival_s=start + request.arrival_s
            )
            if llm.rejection(seqs[index]) is not None:
                bar.update(1)
            cursor += 1
        if core.has_unfinished():
            result = llm.step()
            if result is not None:
                bar.update(len(result.finished))
        elif cursor < len(order):
            wait = requests[order[cursor]].arrival_s - (core.now() - start)
            time.sleep(min(max(wait, 0.0), IDLE_POLL_S * 100))
        else:
            break
    bar.close()
    return [seq for seq in seqs if seq is not None]
