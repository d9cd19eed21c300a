"""Decode stretches make exactly the per-step loop's decisions and events.

What these tests prove:
- a streamed simulation with decode stretches writes every event of the per-step loop, row for
  row and column for column (event ids, steps, block ids, token ids, times), and gives the same
  metrics to the last bit, under configs with prefix hits, a small pool (stretches refused where
  a preemption could happen), chunked prefill, priorities, no overlap, small blocks and untimed;
  and stretches of several steps with finishes inside them did run;
- without a downstream sink ``StreamingMetrics`` folds a stretch's counts instead of its
  sequence and token rows (``add_decode_stretch``), to the same metrics;
- a trace written in segments (``--trace-out``) holds the same rows either way;
- a stretch leaves its survivors behind their token counts (not given its tokens), and bringing
  them up to date (``OverlapScheduler.sync_running``, called before the scheduler reads them)
  gives every running sequence exactly the tokens of the per-step loop at that step;
- ``DecodeStretch.plan`` refuses what it cannot prove: a request waiting, a sequence that
  watches for EOS, claims beyond the free blocks, a user policy.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import Config
from engine.decode_stretch import DecodeStretch
from engine.policy import Policy
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from replay.stream_metrics import StreamingMetrics
from replay.whatif.cost.model import CostModel
from replay.whatif.stream import WorkloadSource, simulate_stream
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request
from tracing.reader import read_trace
from tracing.sink import MemorySink

TIMING = Config(num_kvcache_blocks=400, max_num_seqs=64)
CONFIGS = {
    "as timed": {},
    "small pool preempts": {"num_kvcache_blocks": 60, "max_num_seqs": 32},
    "chunked": {"policy": "chunked", "max_num_batched_tokens": 512},
    "priority": {"policy": "priority"},
    "no overlap": {"async_scheduling": False},
    "small blocks, no prefix cache": {"kvcache_block_size": 16, "enable_prefix_caching": False},
    "eos watched": {"eos": 3},
    "lru, small pool": {"eviction": "lru", "num_kvcache_blocks": 90, "max_num_seqs": 24},
}


class _UserPolicy(Policy):
    name = "user"


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel.fit(record_workload(TIMING, reference_workload(num_seqs=48), StepLaw(),
                                         seed=1))


def requests(count: int, seed: int = 0) -> list[Request]:
    """Poisson arrivals at 40 req/s, half sharing a prompt prefix, most ``ignore_eos``."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / 40, count))
    shared = rng.integers(0, 10000, 512).tolist()
    out = []
    for i in range(count):
        length = int(rng.integers(48, 600))
        prompt = (shared[:length // 2] if i % 2 else []) + \
            rng.integers(0, 10000, length - length // 2 * (i % 2)).tolist()
        out.append(Request(prompt, int(rng.integers(1, 200)), temperature=0.0,
                           ignore_eos=i % 7 != 3, arrival_s=float(arrivals[i])))
    return out


def run(reqs: list[Request], overrides: dict, cost: CostModel | None, stretches: bool,
        monkeypatch: pytest.MonkeyPatch, keep_events: bool = True, **kwargs) -> tuple:
    """A streamed run (stretches on or off) and its events (``keep_events``: a ``MemorySink``
    downstream, which needs every row; else the metrics fold a stretch's counts); counts the
    stretches run (the finishes in each) and the stretches folded as counts."""
    ran: list[int] = []
    folded: list[int] = []
    plan = DecodeStretch.plan.__func__  # type: ignore[attr-defined]
    add = StreamingMetrics.add_decode_stretch

    def counted(cls, scheduler, max_steps, *args):
        stretch = plan(cls, scheduler, max_steps, *args) if stretches else None
        if stretch is not None:
            ran.append(len(stretch._finishing))
        return stretch

    def add_counted(self, *args) -> None:
        folded.append(1)
        add(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(DecodeStretch, "plan", classmethod(counted))
        patch.setattr(StreamingMetrics, "add_decode_stretch", add_counted)
        sink = MemorySink()
        result = simulate_stream(WorkloadSource(reqs, TIMING, "w"), overrides, cost,
                                 downstream=sink if keep_events and not kwargs else None,
                                 **kwargs)
    assert bool(folded) == (bool(ran) and not keep_events and not kwargs)
    return result, sink, ran


@pytest.mark.parametrize("name", list(CONFIGS))
def test_stretches_write_the_per_step_events(cost, name, monkeypatch) -> None:
    reqs = requests(120, seed=5)
    stepped, per_step, none = run(reqs, CONFIGS[name], cost, False, monkeypatch)
    fast, bulk, ran = run(reqs, CONFIGS[name], cost, True, monkeypatch)
    assert not none and ran, "stretches must have run"
    assert any(ran), "some stretch must hold a finish"
    assert stepped.ok and fast.ok
    assert fast.steps is not None and len(fast.steps) > len(ran)  # stretches of several steps
    assert bulk.tables == per_step.tables
    # Without a downstream sink the metrics fold each stretch's counts, not its rows.
    counted, _, _ = run(reqs, CONFIGS[name], cost, True, monkeypatch, keep_events=False)
    for key, value in stepped.metrics.items():
        assert repr(fast.metrics[key]) == repr(value), key
        assert repr(counted.metrics[key]) == repr(value), key
    assert fast.notes == stepped.notes == counted.notes


def test_stretches_untimed(monkeypatch) -> None:
    reqs = requests(40, seed=6)
    _, per_step, _ = run(reqs, CONFIGS["small pool preempts"], None, False, monkeypatch)
    _, bulk, ran = run(reqs, CONFIGS["small pool preempts"], None, True, monkeypatch)
    assert ran and bulk.tables == per_step.tables


def test_trace_out_holds_every_step_of_a_stretch(cost, tmp_path, monkeypatch) -> None:
    reqs = requests(80, seed=7)
    run(reqs, {}, cost, False, monkeypatch, trace_out=tmp_path / "stepped")
    _, _, ran = run(reqs, {}, cost, True, monkeypatch, trace_out=tmp_path / "stretched")
    assert ran
    stepped, stretched = read_trace(tmp_path / "stepped"), read_trace(tmp_path / "stretched")
    assert stepped.complete and stretched.complete and stepped.kinds == stretched.kinds
    for kind in stepped.kinds:
        assert stretched.table(kind).equals(stepped.table(kind)), kind
    # The engine's summary is the same; the recorder's segments hold more steps each (it
    # flushes by the engine's step-end calls, one per stretch).
    for key in ("steps", "requests", "rejected", "completion_tokens", "preemptions", "elapsed_s"):
        assert stepped.summary[key] == stretched.summary[key], key


def _decoding_scheduler(config: Config, ignore_eos: bool = True) -> Scheduler:
    """A scheduler with two admitted, decoding sequences and nothing waiting."""
    from engine.engine_core import EngineCore
    from replay.whatif.sim_executor import SimClock, SimExecutor

    core = EngineCore(config, SimExecutor(config.num_kvcache_blocks, SimClock()))
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=ignore_eos)
    for start in (0, 100):
        core.add_request(list(range(start, start + 30)), params)
    core.step()  # the prefill
    core.step()  # a decode: both have sampled
    return core.scheduler


def test_plan_proves_a_stretch_of_steady_decodes() -> None:
    stretch = DecodeStretch.plan(_decoding_scheduler(Config(num_kvcache_blocks=40)), 100)
    assert stretch is not None and stretch.num_seqs[0] == 2
    assert stretch.num_steps == 39 - 1  # until both finish (40 tokens, two sampled)


def test_plan_refuses_what_it_cannot_prove() -> None:
    config = Config(num_kvcache_blocks=40, kvcache_block_size=16)
    scheduler = _decoding_scheduler(config)
    assert DecodeStretch.plan(scheduler, 0) is None
    scheduler.waiting.append(Sequence(9, [1, 2], SamplingParams(max_tokens=2)))
    assert DecodeStretch.plan(scheduler, 10) is None  # a request waits
    scheduler.waiting.clear()
    assert DecodeStretch.plan(scheduler, 10) is not None
    eos = _decoding_scheduler(config.replace(eos=5), ignore_eos=False)
    assert DecodeStretch.plan(eos, 10) is None  # an EOS could end a sequence early
    small = _decoding_scheduler(config.replace(num_kvcache_blocks=6))  # 4 held, 2 free
    assert DecodeStretch.plan(small, 1) is not None
    assert DecodeStretch.plan(small, 38) is None  # claims more blocks than are free
    user = _decoding_scheduler(config.replace(policy=f"{__name__}:_UserPolicy"))
    assert DecodeStretch.plan(user, 10) is None  # a user policy might admit otherwise


def test_plan_proves_blocks_as_the_exact_claims_do() -> None:
    """Where ``plan`` skips counting the blocks a stretch claims (free blocks for the most any
    sequence can claim, and one more each), it decides as the exact count does: every block
    claimed free now and one block left per running sequence."""
    for num_blocks in range(6, 14):
        scheduler = _decoding_scheduler(Config(num_kvcache_blocks=num_blocks,
                                               kvcache_block_size=16))
        for max_steps in (1, 2, 15, 16, 17, 33, 38):
            running, free = list(scheduler.running), len(scheduler.block_manager.free_block_ids)
            last = [min(s.num_prompt_tokens + s.max_tokens, scheduler.max_model_len)
                    - s.num_tokens - 1 for s in running]
            steps = min(max_steps, max(last) + 1)
            claims = sum(max(-(-(s.num_tokens + min(end, steps - 1)) // 16)
                             - len(s.block_table), 0) for s, end in zip(running, last))
            proven = claims <= free and free - claims >= len(running)
            stretch = DecodeStretch.plan(scheduler, max_steps)
            assert (stretch is not None) == proven, (num_blocks, max_steps)


@pytest.mark.parametrize("keep_events", [True, False])
def test_a_stretch_result_is_its_last_steps(cost, monkeypatch, keep_events) -> None:
    """A stretch's result (its batch and output made when read) is the per-step loop's result
    of the stretch's last step: same step, batch, tokens and duration; its ``finished`` holds
    every sequence finished in the stretch."""
    from replay.whatif.stream import StreamInputs

    def seen(results: dict) -> object:
        def on_result(self, result, now) -> None:
            batch = result.batch
            results[result.step] = (
                batch.step, batch.kind, [s.seq_id for s in batch.seqs], batch.context_lens,
                batch.num_new_tokens, batch.sampled_seqs == batch.seqs,
                result.output.token_ids, result.output.padded_batch_size, result.duration_s)
            finished.setdefault(id(results), []).extend(s.seq_id for s in result.finished)
            on(self, result, now)
        return on_result

    on, finished = StreamInputs.on_result, {}
    reqs = requests(60, seed=8)
    stepped, stretched = {}, {}
    with monkeypatch.context() as patch:
        patch.setattr(StreamInputs, "on_result", seen(stepped))
        run(reqs, {}, cost, False, monkeypatch)
        patch.setattr(StreamInputs, "on_result", seen(stretched))
        _, _, ran = run(reqs, {}, cost, True, monkeypatch, keep_events=keep_events)
    assert ran and len(stretched) < len(stepped)
    for step, values in stretched.items():
        assert values == stepped[step], step
    assert finished[id(stretched)] == finished[id(stepped)]


@pytest.mark.parametrize("seed", range(6))
def test_a_stretchs_steps_are_its_running_sequences(seed) -> None:
    """Each step's batch size, context tokens, longest context, block visits and finishes, as
    a stretch plans them, are those of the sequences still running at that step (the
    definition, as a sequence x step matrix), also where the longest sequences finish first."""
    from engine.engine_core import EngineCore
    from replay.whatif.sim_executor import SimClock, SimExecutor

    rng = np.random.default_rng(seed)
    config = Config(num_kvcache_blocks=400, kvcache_block_size=16)
    core = EngineCore(config, SimExecutor(config.num_kvcache_blocks, SimClock()))
    lengths = rng.integers(20, 300, 12)
    for length, count in zip(lengths, rng.integers(2, 40, 12)):
        # The longest prompts sample the fewest tokens: they finish first.
        tokens = int(count) if length < lengths.max() - 60 else int(rng.integers(2, 5))
        core.add_request(rng.integers(0, 9000, int(length)).tolist(),
                         SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    while core.scheduler.waiting or core.scheduler.prefilling:
        core.step()
    stretch = DecodeStretch.plan(core.scheduler, 200)
    assert stretch is not None
    num_tokens, last = stretch._num_tokens, stretch._last_step
    steps = np.arange(stretch.num_steps)
    running = steps <= last[:, None]
    contexts = (num_tokens[:, None] + steps) * running
    assert stretch.num_seqs == running.sum(axis=0).tolist()
    assert stretch.context_tokens == contexts.sum(axis=0).tolist()
    assert stretch.longest_contexts == contexts.max(axis=0).tolist()
    due_steps, due_seqs = np.nonzero((((num_tokens[:, None] + steps) % 16 < 2) & running).T)
    due: dict[int, list[int]] = {}
    for step, index in zip(due_steps.tolist(), due_seqs.tolist()):
        due.setdefault(step, []).append(index)
    assert stretch._due == due and due
    assert sorted(i for f in stretch._finishing.values() for i in f) == \
        np.flatnonzero(last < stretch.num_steps).tolist()
    top = int(num_tokens.max())  # the longest finished inside the stretch:
    assert any(longest != top + step for step, longest in enumerate(stretch.longest_contexts))


@pytest.mark.parametrize("keep_events", [True, False])
def test_lagging_sequences_sync_to_the_per_step_tokens(cost, monkeypatch, keep_events) -> None:
    """After each stretch some running sequences lack its tokens; ``sync_running`` (what the
    scheduler calls before reading them, and ``Scheduler.finish``) gives each running sequence
    the token ids, count and computed count the per-step loop gave it by that step."""
    from replay.whatif.stream import StreamInputs

    on = StreamInputs.on_result

    def seen(states: dict, sync: bool) -> object:
        def on_result(self, result, now) -> None:
            scheduler = self.core.scheduler
            lagging = scheduler.sync_running is not None
            if sync and lagging:
                scheduler.sync_running()
                assert scheduler.sync_running is None
            states[result.step] = (lagging, {s.seq_id: (list(s.token_ids), s.num_tokens,
                                                         s.num_computed_tokens)
                                             for s in scheduler.running})
            on(self, result, now)
        return on_result

    reqs = requests(60, seed=5)
    stepped, stretched = {}, {}
    with monkeypatch.context() as patch:
        patch.setattr(StreamInputs, "on_result", seen(stepped, False))
        run(reqs, CONFIGS["small pool preempts"], cost, False, monkeypatch)
        patch.setattr(StreamInputs, "on_result", seen(stretched, True))
        _, _, ran = run(reqs, CONFIGS["small pool preempts"], cost, True, monkeypatch,
                        keep_events=keep_events)
    assert ran and sum(lagging for lagging, _ in stretched.values()) > 10
    for step, (_, running) in stretched.items():
        assert running == stepped[step][1], step
