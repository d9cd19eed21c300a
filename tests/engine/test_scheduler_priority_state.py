"""The scheduler keeps nothing per request once the request has finished.

Before: ``Scheduler.priorities`` (seq id -> priority, for requests added with one) was never
emptied, so a server running for days with prioritized traffic, or a streamed what-if of a
million requests with priorities, held one entry per request ever added (the design promises
flat memory). The priority now lives on the request (``Sequence.priority``), which goes when
the engine forgets it, and stays readable for a finished one (the property observer reads it).
"""

from __future__ import annotations

from collections import deque

from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from replay.verify import verify_events
from tracing.sink import MemorySink


def test_finished_requests_leave_nothing_in_the_scheduler() -> None:
    """Requests finished by length, aborted while waiting or running, and rejected: no
    container of the scheduler holds an entry afterwards; each request still reads the priority
    it was added with, and the run verifies."""
    core = EngineCore(Config(num_kvcache_blocks=8, kvcache_block_size=4, max_model_len=32,
                             max_num_batched_tokens=32, max_num_seqs=2, policy="priority"),
                      NullExecutor(8), sink=MemorySink())
    params = SamplingParams(temperature=0.6, max_tokens=5, ignore_eos=True)
    seqs = [core.add_request([i + 1, i + 2, i + 3], params, priority=i % 3 + 1) for i in range(9)]
    core.add_request(list(range(1, 40)), params, priority=7)  # longer than max_model_len
    core.step()
    scheduler = core.scheduler
    running = scheduler.running[0]
    core.abort(running.seq_id)
    core.abort(scheduler.waiting[-1].seq_id)
    core.run_until_idle()
    core.close()
    left = {name: value for name, value in vars(scheduler).items()
            if isinstance(value, (dict, set, list, deque)) and value}
    assert not left, f"per-request state left in the scheduler: {left}"
    assert [scheduler.priority(s) for s in seqs] == [i % 3 + 1 for i in range(9)]
    result = verify_events(core.sink.header, core.sink.tables)
    assert result.identical, result.report()
