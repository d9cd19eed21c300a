"""verify: replay == record for every config, and each kind of tampering is caught where it is."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from replay.verify import verify, verify_events
from tracing.sink import MemorySink

REPO = Path(__file__).resolve().parents[2]


def record(config: Config, num_requests: int = 24, seed: int = 0) -> MemorySink:
    """Record a workload with shared prefixes and varied lengths into memory."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 500, size=3 * config.kvcache_block_size).tolist()
    sink = MemorySink()
    core = EngineCore(config, NullExecutor(config.num_kvcache_blocks, vocab_size=500), sink=sink)
    for i in range(num_requests):
        tail = rng.integers(0, 500, size=int(rng.integers(1, 40))).tolist()
        prompt = (shared[: int(rng.integers(0, len(shared)))] if i % 2 else []) + tail
        params = SamplingParams(
            temperature=0.6, max_tokens=int(rng.integers(1, 30)), ignore_eos=True
        )
        core.add_request(prompt, params)
    core.run_until_idle()
    core.close()
    return sink


CONFIGS = {
    "default-ish": Config(num_kvcache_blocks=512, kvcache_block_size=16, max_model_len=256,
                          max_num_batched_tokens=512),
    "tiny-pool-preempts": Config(num_kvcache_blocks=12, kvcache_block_size=8, max_model_len=96,
                                 max_num_batched_tokens=256),
    "few-seqs": Config(num_kvcache_blocks=64, kvcache_block_size=4, max_num_seqs=3,
                       max_model_len=128, max_num_batched_tokens=128),
    "small-token-budget": Config(num_kvcache_blocks=200, kvcache_block_size=1, max_model_len=64,
                                 max_num_batched_tokens=64),
    "chunked": Config(num_kvcache_blocks=30, kvcache_block_size=8, policy="chunked",
                      max_num_batched_tokens=24, max_model_len=128),
    # The prefix cache of traces recorded before prefix_cache_duplicates: one block per hash.
    "tiny-pool-one-block-per-hash": Config(num_kvcache_blocks=12, kvcache_block_size=8,
                                           max_model_len=96, max_num_batched_tokens=256,
                                           prefix_cache_duplicates=False),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_verify_is_identical_for_each_config(name: str) -> None:
    """Re-driving the scheduler with the recorded tokens reproduces every decision event."""
    sink = record(CONFIGS[name])
    result = verify_events(sink.header, sink.tables)
    assert result.identical, result.report()
    assert result.num_events == sum(len(t["event_id"]) for t in sink.tables.values())
    if name == "tiny-pool-preempts":
        assert sink.tables["preempted"]["seq_id"], "this config is meant to preempt"


def _recorded() -> MemorySink:
    return record(CONFIGS["tiny-pool-preempts"])


def test_changed_token_is_caught_at_the_first_event_it_affects() -> None:
    """A changed sampled token changes the block hash or output hash that depends on it."""
    sink = _recorded()
    tables = copy.deepcopy(sink.tables)
    tokens = tables["token_sampled"]
    index = len(tokens["token_id"]) // 2
    tokens["token_id"][index] += 1
    seq_id, step = tokens["seq_id"][index], tokens["step"][index]
    result = verify_events(sink.header, tables)
    assert not result.identical
    d = result.divergence
    assert d is not None and d.step >= step
    assert d.recorded is not None and d.recorded["seq_id"] == seq_id
    assert d.recorded["kind"] in ("block_hashed", "request_finished")


def test_dropped_block_event_is_caught_at_its_id() -> None:
    """Removing one block_allocated row makes verify stop at exactly that event id."""
    sink = _recorded()
    tables = copy.deepcopy(sink.tables)
    rows = tables["block_allocated"]
    index = len(rows["event_id"]) // 3
    dropped_id = rows["event_id"][index]
    for column in rows.values():
        del column[index]
    result = verify_events(sink.header, tables)
    assert not result.identical
    assert result.divergence is not None
    assert result.divergence.event_id == dropped_id
    assert result.divergence.recorded is None
    assert result.divergence.replayed is not None
    assert result.divergence.replayed["kind"] == "block_allocated"


def test_swapped_events_are_caught_at_the_first_of_them() -> None:
    """Swapping the ids (the order) of two adjacent events of different kinds is caught."""
    sink = _recorded()
    tables = copy.deepcopy(sink.tables)
    where = {e: (kind, i) for kind, t in tables.items() for i, e in enumerate(t["event_id"])}
    a_ids = tables["block_allocated"]["event_id"]
    first = next(e for e in a_ids[5:] if where[e + 1][0] != "block_allocated")
    other_kind, other_index = where[first + 1]
    a_ids[a_ids.index(first)] = first + 1
    tables[other_kind]["event_id"][other_index] = first
    result = verify_events(sink.header, tables)
    assert not result.identical
    assert result.divergence is not None and result.divergence.event_id == first


def test_header_with_another_block_count_is_caught() -> None:
    """A header whose pool size was edited fails at the first block event (free count differs)."""
    sink = _recorded()
    header = copy.deepcopy(sink.header)
    header["config"]["num_kvcache_blocks"] += 1
    result = verify_events(header, sink.tables)
    assert not result.identical
    d = result.divergence
    assert d is not None and d.recorded is not None
    assert d.recorded["kind"].startswith("block_")
    assert "free_blocks" in d.columns


def test_report_shows_both_sides_and_context() -> None:
    """The divergence report names the event and prints recorded and replayed side by side."""
    sink = _recorded()
    tables = copy.deepcopy(sink.tables)
    tables["block_allocated"]["block_id"][10] += 1
    text = verify_events(sink.header, tables).report()
    assert text.startswith("diverged at event")
    assert "recorded" in text and "replayed" in text and "<--" in text
    assert "last events before it" in text


RECORD_SCRIPT = """
import sys
from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from tracing.recorder import ParquetRecorder
cfg = Config(num_kvcache_blocks=20, kvcache_block_size=8, max_model_len=128,
             max_num_batched_tokens=256)
core = EngineCore(cfg, NullExecutor(20, vocab_size=300), sink=ParquetRecorder(sys.argv[1]))
for i in range(16):
    prompt = [7] * 16 + [i % 5] * (1 + i % 11)
    core.add_request(prompt, SamplingParams(temperature=0.6, max_tokens=5 + i, ignore_eos=True))
core.run_until_idle()
core.close()
"""


def test_record_and_verify_in_processes_with_different_hash_seeds(tmp_path: Path) -> None:
    """A trace recorded in one process verifies in another with a different PYTHONHASHSEED."""
    pytest.importorskip("tracing.recorder")
    trace = tmp_path / "trace"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "1"}
    subprocess.run([sys.executable, "-c", RECORD_SCRIPT, str(trace)], check=True, env=env)
    env["PYTHONHASHSEED"] = "2"
    proc = subprocess.run(
        [sys.executable, "-m", "replay.cli.main", "verify", str(trace)],
        env=env, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("identical:")
    assert verify(str(trace)).identical


def _cut_trace(tmp_path: Path, keep_segments: int) -> Path:
    """A trace of the tiny-pool config as a killed run leaves it: no summary.json, only the
    first ``keep_segments`` commit markers."""
    from tracing.layout import COMMITS_DIR
    from tracing.recorder import ParquetRecorder

    config = CONFIGS["tiny-pool-preempts"]
    trace = tmp_path / "t"
    recorder = ParquetRecorder(trace, flush_steps=4, fsync=False)
    core = EngineCore(config, NullExecutor(config.num_kvcache_blocks, vocab_size=500),
                      sink=recorder)
    for i in range(12):
        core.add_request([3 + i] * (5 + i), SamplingParams(max_tokens=6, ignore_eos=True))
    core.run_until_idle()
    core.close()
    (trace / "summary.json").unlink()
    for marker in sorted((trace / COMMITS_DIR).glob("seg-*.json"))[keep_segments:]:
        marker.unlink()
    return trace


def test_an_incomplete_trace_says_how_far_it_was_verified(tmp_path: Path) -> None:
    """Verifying a killed run's trace names the last step verified (the last committed one),
    not only "the recorded prefix", and is "identical": every committed decision replayed the
    same. With no step committed there is nothing to verify: that used to be "identical" too
    (a proof of nothing); now ``verify`` raises a one-line ``TraceError`` saying so."""
    from replay.recorded import from_trace
    from replay.verify import NOTHING_COMMITTED, verify_recorded
    from tracing import read_trace
    from tracing.errors import TraceError

    trace = _cut_trace(tmp_path, keep_segments=2)
    last = read_trace(trace).last_step
    result = verify(str(trace))
    assert result.identical and not result.complete and result.last_step == last >= 0
    assert result.report().endswith(
        f"(incomplete trace: verified the recorded prefix, steps 0 to {last})")
    for marker in (trace / "_commits").glob("seg-*.json"):
        marker.unlink()
    with pytest.raises(TraceError, match="no committed step") as raised:
        verify(str(trace))
    assert str(raised.value) == f"{trace}: {NOTHING_COMMITTED}" and "\n" not in NOTHING_COMMITTED
    with pytest.raises(TraceError, match="nothing to verify"):  # the events, as read
        verify_recorded(from_trace(read_trace(trace)))


def test_a_complete_trace_of_a_run_without_steps_verifies(tmp_path: Path) -> None:
    """A run closed cleanly without a step (no request given) is a whole record of nothing
    scheduled: "identical", and the report says the run scheduled no step."""
    from tracing.recorder import ParquetRecorder

    config = CONFIGS["tiny-pool-preempts"]
    trace = tmp_path / "t"
    core = EngineCore(config, NullExecutor(config.num_kvcache_blocks, vocab_size=500),
                      sink=ParquetRecorder(trace, fsync=False))
    core.run_until_idle()
    core.close()
    result = verify(str(trace))
    assert result.complete and result.identical and result.num_steps == 0
    assert result.report() == (f"identical: {result.num_events} events over 0 steps "
                               "(complete trace of a run that scheduled no step)")


def test_a_replay_that_stopped_early_says_why_on_the_first_line() -> None:
    """When the replay stops early (here a divergence it cannot follow), the report's first
    line carries the reason; it used to come after the whole side-by-side table."""
    from replay.verify import Divergence, VerifyResult

    d = Divergence(event_id=0, step=0, recorded={"kind": "request_added", "event_id": 0},
                   replayed=None, columns=[], context=[])
    text = VerifyResult(False, 10, 2, True, d,
                        replay_note="policy 'm:P' raised ValueError").report()
    first = text.splitlines()[0]
    assert first.startswith("diverged at event 0") and "replay stopped: policy 'm:P'" in first
    assert text.count("replay stopped") == 1


@pytest.mark.parametrize("kind", ["model_step", "batch_scheduled"])
def test_report_names_the_event_kind_and_marks_only_compared_columns(kind: str) -> None:
    """``batch_scheduled`` and ``model_step`` have a column named ``kind`` (the batch kind):
    the report's event dict took it over, so a tampered step read "diverged at event N (step S,
    prefill)", naming neither event, and context lines "#N step S decode: ...". The event's
    kind now stays ``kind``, the column shows as ``batch_kind``; and a measured column (times,
    never compared) is shown without the ``<--`` that marked it as differing."""
    sink = _recorded()
    tables = copy.deepcopy(sink.tables)
    rows = tables[kind]
    index = next(i for i, k in enumerate(rows["kind"]) if k == "decode")
    rows["kind"][index] = "prefill"
    if kind == "model_step":  # a replay measures other times: shown, not marked
        rows["wall_time_s"][index] += 1.0
        rows["duration_s"][index] += 1.0
    result = verify_events(sink.header, tables)
    d = result.divergence
    assert d is not None and d.event_id == rows["event_id"][index]
    assert d.recorded is not None and d.recorded["kind"] == kind
    assert d.recorded["batch_kind"] == "prefill" and d.columns == ["kind"]
    text = result.report()
    assert text.splitlines()[0].startswith(f"diverged at event {d.event_id} (step {d.step}, "
                                           f"{kind})")
    marked = [line.split()[0] for line in text.splitlines() if line.endswith("<--")]
    assert marked == ["batch_kind"]
    context = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert context and not any(" decode:" in line or " prefill:" in line for line in context)
