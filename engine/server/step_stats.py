"""The engine's state after a step, for ``/metrics``: measured where the engine runs (its
thread or its process), applied to the Prometheus metrics in the frontend."""

from __future__ import annotations

from typing import Any, NamedTuple

from engine.engine_core import EngineCore, StepResult


class StepStats(NamedTuple):
    """A step's gauges and counter increments (a plain tuple: it crosses the process pipe)."""

    running: int
    waiting: int
    kv_usage: float
    preemptions: int  # the scheduler's total so far
    prefix_queries: int
    prefix_hits: int
    prompt_tokens: int
    generation_tokens: int
    # Seconds each request first scheduled in this step waited since its arrival (vLLM's
    # ``request_queue_time_seconds``: first scheduled less queued; one each, never again on a
    # preempted request's recompute).
    queue_times: tuple[float, ...] = ()
    # Seconds since its previous token of each request this step gave a token after its first
    # (vLLM's ``inter_token_latency_seconds``: one per engine step and request, on the engine's
    # clock). The frontend cannot take them: a stream behind the engine reads several steps'
    # tokens at once, and it observed one averaged value for them, or none.
    inter_token_times: tuple[float, ...] = ()


class TokenClock:
    """When each request that has a token got its last one (``core.now()``): what its next
    token's latency is measured from. One per engine core, kept beside it by the loop that
    takes its steps' stats. An entry goes when its request finishes in a step, or, ended
    between steps (an abort, a stop string), with the next step's check."""

    def __init__(self) -> None:
        self.last_token_s: dict[int, float] = {}

    def inter_token_times(self, core: EngineCore, result: StepResult,
                          now: float) -> tuple[float, ...]:
        """Each of the step's tokens after a request's first: ``now`` less its previous
        token's step (a preempted request's includes its wait, as vLLM's does)."""
        last = self.last_token_s
        times = []
        for seq, _ in zip(result.batch.sampled_seqs, result.output.token_ids):
            previous = last.get(seq.seq_id)
            if previous is not None:
                times.append(max(0.0, now - previous))
            last[seq.seq_id] = now
        for seq in result.finished:
            last.pop(seq.seq_id, None)
        held = core.sequences  # the requests added and not forgotten (the scheduler's running
        # list misses one whose step is in flight)
        if len(last) > len(held):
            # one ended between steps (and forgotten) is still here: keep the unfinished
            # requests (a preempted one waits with its tokens), so the table never outgrows
            # the engine's
            for seq_id in [s for s in last if s not in held or held[s].is_finished]:
                del last[seq_id]
        return tuple(times)


def step_stats(core: EngineCore, result: StepResult, clock: TokenClock) -> StepStats:
    """What ``result``'s step did and the scheduler's state after it (``clock``: the core's
    ``TokenClock``, for the inter-token latencies)."""
    batch = result.batch
    queried = hits = computed = 0
    now = core.now()
    began = now - result.duration_s  # when the step started (its end less its time)
    waits = []
    for i in range(batch.num_prefill_seqs):
        seq, new = batch.seqs[i], batch.num_new_tokens[i]
        computed += new
        if batch.context_lens[i] - new == seq.num_cached_tokens:  # its first chunk
            queried += seq.num_prompt_tokens
            hits += seq.num_cached_tokens
            if not seq.num_preemptions:  # scheduled for the first time
                waits.append(max(0.0, began - seq.arrival_s))
    return state_stats(core)._replace(prefix_queries=queried, prefix_hits=hits,
                                      prompt_tokens=computed,
                                      generation_tokens=len(result.output.token_ids),
                                      queue_times=tuple(waits),
                                      inter_token_times=clock.inter_token_times(core, result, now))


def state_stats(core: EngineCore) -> StepStats:
    """The scheduler's state now, no step's counts: also for requests the frontend ended
    between steps (an abort, a stop string). The last one ended leaves the engine idle, with no
    step after it to report that nothing runs and no block is held any more."""
    scheduler, pool = core.scheduler, core.scheduler.block_manager
    return StepStats(len(scheduler.running), len(scheduler.waiting),
                     1.0 - len(pool.free_block_ids) / max(pool.num_blocks, 1),
                     scheduler.num_preemptions, 0, 0, 0, 0)


class StatsApplier:
    """Applies ``StepStats`` to a ``ServerMetrics`` (preemptions arrive as a running total)."""

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics
        self._preemptions = 0

    def apply(self, stats: StepStats) -> None:
        m = self.metrics
        m.running.set(stats.running)
        m.waiting.set(stats.waiting)
        m.kv_usage.set(stats.kv_usage)
        if stats.preemptions > self._preemptions:
            m.preemptions.inc(stats.preemptions - self._preemptions)
            self._preemptions = stats.preemptions
        if stats.prefix_queries or stats.prompt_tokens:
            m.prefix_queries.inc(stats.prefix_queries)
            m.prefix_hits.inc(stats.prefix_hits)
            m.prompt_tokens.inc(stats.prompt_tokens)
        m.generation_tokens.inc(stats.generation_tokens)
        for wait in stats.queue_times:
            m.queue.observe(wait)
        for latency in stats.inter_token_times:
            m.itl.observe(latency)
