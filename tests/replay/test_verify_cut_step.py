"""A replay that stops inside a step (``ReplayDiverged``: the scheduler chose other sequences than
the recording sampled) keeps the decision events that step emitted, so the divergence names the
decision that parted, not the step's first event against nothing (replay/replayer.py)."""

from __future__ import annotations

import copy

from engine.config import Config
from engine.engine_core import EngineCore
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from replay.verify import verify_events
from tracing.sink import MemorySink

CONFIG = Config(num_kvcache_blocks=64, kvcache_block_size=8, max_num_seqs=4, max_model_len=128,
                max_num_batched_tokens=256)


def _recorded() -> MemorySink:
    sink = MemorySink()
    core = EngineCore(CONFIG, NullExecutor(CONFIG.num_kvcache_blocks, vocab_size=500), sink=sink)
    for i in range(4):
        core.add_request(list(range(10 + i, 30 + 2 * i)),
                         SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    core.run_until_idle()
    core.close()
    return sink


def test_a_replay_that_parts_in_step_0_names_the_decision_not_the_first_add() -> None:
    """The header edited to admit two sequences a step where four were recorded: the replay
    stops in step 0, and the report names step 0's scheduling (a replayed event beside the
    recorded one), with the executor's note. Before, the step's events were dropped with it,
    and the report read "request_added" against no event: the adds had not diverged."""
    sink = _recorded()
    header = copy.deepcopy(sink.header)
    header["config"]["max_num_seqs"] = 2
    result = verify_events(header, sink.tables)
    assert not result.identical
    divergence = result.divergence
    assert divergence is not None and divergence.step == 0
    assert divergence.recorded is not None and divergence.replayed is not None, divergence
    decisions = {"batch_scheduled", "seq_scheduled", "block_allocated", "block_hit",
                 "block_hashed"}
    assert {divergence.recorded["kind"], divergence.replayed["kind"]} <= decisions, divergence
    assert "replay samples sequences" in (result.replay_note or "")


def test_an_unedited_recording_still_verifies_identical() -> None:
    """Keeping a cut step's events changes nothing where no step is cut."""
    sink = _recorded()
    assert verify_events(sink.header, sink.tables).identical
