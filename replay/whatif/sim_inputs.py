"""A recording's requests, aborts and stops, fed to a simulated engine (``engine.drive.Inputs``).

``replay.whatif.simulate`` drives each variant with ``RecordedInputs``: requests join at their
recorded arrival times (timed) or steps (untimed), aborts likewise, and a request the source
stopped at a stop string stops at the same point of its text.
"""

from __future__ import annotations

from engine.engine_core import EngineCore, StepResult
from replay.whatif.sim_executor import SimExecutor
from replay.whatif.source import SimWorkload


class RecordedInputs:
    """A workload's requests and aborts, due at their times (timed) or recorded steps.

    A stop string ends a request at a point of its text, not of the clock: a request the
    source stopped (reason ``stop``) stops once it has sampled the tokens it had sampled when
    the source stopped it (``on_result``, after the step that sampled the last of them, as
    ``LLM.check_stops`` does), whatever time or step that comes at under the variant. (Fed
    at its recorded time, a faster or slower variant stopped it tokens early or late: the
    source's own configuration predicted other token counts than it recorded.) A stop with no
    recorded token is fed like an abort."""

    def __init__(self, executor: SimExecutor, workload: SimWorkload, timed: bool) -> None:
        self.executor = executor
        self.requests = workload.requests
        self.keys = [r.arrival_s if timed else r.step for r in self.requests]
        self.order = sorted(range(len(self.requests)), key=lambda i: (self.keys[i], i))
        # request index -> tokens after which it stops (its recorded completion's length)
        self.stop_after: dict[int, int] = {}
        for _, _, index in workload.stops:
            recorded = self.requests[index].tokens
            if recorded is not None and len(recorded):
                self.stop_after[index] = len(recorded)
        self.aborts = sorted(
            [(a[0] if timed else a[1], a[2], "aborted") for a in workload.aborts]
            + [(a[0] if timed else a[1], a[2], "stop") for a in workload.stops
               if a[2] not in self.stop_after]
        )
        self.seq_of: dict[int, int] = {}
        self.core: EngineCore | None = None  # the engine fed (``feed``)
        self.stops: dict[int, int] = {}  # seq_id -> tokens after which it stops (added ones)
        self.next_add = self.next_abort = 0

    def feed(self, core: EngineCore, now: float) -> None:
        self.core = core
        order, keys, requests = self.order, self.keys, self.requests
        while self.next_add < len(order) and keys[order[self.next_add]] <= now:
            index = order[self.next_add]
            request = requests[index]
            seq = core.add_request(request.prompt, request.params, arrival_s=request.arrival_s,
                                   error=request.precheck_error, priority=request.priority)
            self.executor.bind(seq.seq_id, request.tokens)
            self.executor.admit(len(request.prompt), request.arrival_s)
            self.seq_of[index] = seq.seq_id
            if index in self.stop_after:
                self.stops[seq.seq_id] = self.stop_after[index]
            self.next_add += 1
        aborts = self.aborts
        while self.next_abort < len(aborts) and aborts[self.next_abort][0] <= now:
            _, index, reason = aborts[self.next_abort]
            target = self.seq_of.get(index)
            if target is not None:
                core.finish(target, reason)
            self.next_abort += 1

    def next_due(self) -> float | None:
        """The next arrival (an abort still due after the last arrival has nothing to stop)."""
        if self.next_add >= len(self.order):
            return None
        return self.keys[self.order[self.next_add]]

    def on_result(self, result: StepResult, now: float) -> None:
        """Stop each request that has now sampled its recorded completion up to its stop."""
        stops = self.stops
        if not stops:
            return
        for seq in result.batch.sampled_seqs:
            limit = stops.get(seq.seq_id)
            if limit is not None and seq.num_completion_tokens >= limit:
                del stops[seq.seq_id]
                if not seq.is_finished and self.core is not None:
                    self.core.finish(seq.seq_id, "stop")
