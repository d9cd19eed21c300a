"""Run a workload on a live engine, letting requests arrive at their recorded times."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from engine.drive import drive
from engine.engine_core import EngineCore, StepResult
from engine.llm import LLMEngine
from engine.sequence import Sequence
from replay.workloads.inputs import WorkloadInputs
from replay.workloads.request import Request

IDLE_POLL_S = 0.001
# Prompt tokens a live run builds before it starts (``WorkloadInputs.prepare``; ~36 bytes a
# token as Python ints: ~300 MB at most); a larger workload builds the rest as they fall due.
PREPARED_PROMPT_TOKENS = 8 * 2**20


class _CountingInputs(WorkloadInputs):
    """The workload's inputs, counting finished requests on the progress bar."""

    def __init__(self, *args: Any, bar: Any, check: Callable[[], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bar = bar
        self.check = check

    def feed(self, core: EngineCore, now: float) -> None:
        if self.check is not None:  # between two steps: the run may stop here, consistently
            self.check()
        super().feed(core, now)

    def on_result(self, result: StepResult, now: float) -> None:
        super().on_result(result, now)
        self.bar.update(len(result.finished))


def _encoder(llm: LLMEngine) -> Any:
    def encode(text: str) -> list[int]:
        return llm.tokenizer.encode(text, add_special_tokens=False)

    return encode


def run_workload(llm: LLMEngine, requests: list[Request], use_tqdm: bool = True,
                 check: Callable[[], None] | None = None) -> list[Sequence]:
    """Submit each request once the run's clock passes its ``arrival_s`` (a conversation's later
    turn: its think time after the previous turn finished, ``WorkloadInputs``); step until all
    finish.

    Returns the sequences in workload order (a turn never sent, its previous turn rejected, is
    left out). All-zero arrivals make an offline batch. ``check`` is called before each step
    and may raise to stop the run there (``replay.cli.interrupt``).
    """
    core = llm.core
    bar = tqdm(total=len(requests), desc="run", disable=not use_tqdm, dynamic_ncols=True)

    def submit(index: int, prompt: list[int] | str, due: float) -> Sequence:
        seq = llm.add_request(prompt, requests[index].sampling_params(), arrival_s=start + due,
                              priority=requests[index].priority)
        if llm.rejection(seq) is not None:
            bar.update(1)
        return seq

    inputs = _CountingInputs(requests, submit, encode=_encoder(llm), bar=bar, check=check)
    inputs.prepare(PREPARED_PROMPT_TOKENS)  # before the clock starts: not the loop's work
    start = core.now()

    def now() -> float:
        return core.now() - start

    def wait_until(due: float) -> None:
        core.on_idle()  # the recorder flushes on its time limit while nothing runs
        time.sleep(min(max(due - now(), 0.0), IDLE_POLL_S * 100))

    try:
        drive(core, inputs, now, wait_until)
        bar.update(inputs.skipped_turns)
    finally:
        bar.close()  # also when stopped: no redraw after the caller's last line
    return [seq for seq in inputs.seqs if seq is not None]
