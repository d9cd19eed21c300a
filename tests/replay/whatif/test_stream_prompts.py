"""The streaming simulator hands the engine its prompts as int32 arrays: nothing else changes.

What these tests prove:
- ``prompt_ids`` turns a numpy prompt, a recipe or a list into an ``array('i')`` of the same
  values, and keeps a list where a value does not fit int32 (the engine then refuses it with its
  one-line error, as before);
- a streamed run (array prompts) writes exactly the hashes of ``run_variant``'s run (list
  prompts): every ``block_hashed`` hash and parent hash, every ``block_hit`` hash and every
  ``request_finished.output_hash`` (the decision comparison of ``test_stream`` blanks these), with
  prefix hits, preemptions and prefix caching off;
- without a downstream sink the prompts are not copied into the buffer (``needs_prompt_tokens``)
  and the metrics are the same as with one.
"""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from engine.config import Config
from engine.engine_core import EngineCore
from engine.errors import InvalidRequestError
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from replay.recorded import from_columns
from replay.stream_metrics import StreamingMetrics
from replay.whatif.cost.model import CostModel
from replay.whatif.simulate import run_variant, workload_from_requests
from replay.whatif.stream import WorkloadSource, prompt_ids, simulate_stream
from replay.workloads.recipe import PromptRecipe
from tests.replay.whatif.test_stream import CONFIGS, TIMING, cost, poisson_requests  # noqa: F401
from tracing.sink import MemorySink

HASH_COLUMNS = {"block_hashed": ("hash", "parent_hash", "block_id", "seq_id"),
                "block_hit": ("hash", "block_id", "seq_id"),
                "request_finished": ("output_hash", "seq_id"),
                "token_sampled": ("token_id", "seq_id")}


def test_prompt_ids_give_int32_arrays_of_the_same_values() -> None:
    values = [5, 0, 9999, 2**31 - 1]
    for prompt in (np.array(values, np.int32), np.array(values, np.int64), values):
        tokens = prompt_ids(prompt)
        assert isinstance(tokens, array) and tokens.typecode == "i"
        assert tokens.tolist() == values
    recipe = PromptRecipe((3,), 16, 40, salt=2)
    assert prompt_ids(recipe).tolist() == recipe.tokens().tolist()
    too_big = [1, 2**31]
    for prompt in (too_big, np.array(too_big, np.int64)):
        kept = prompt_ids(prompt)
        assert kept == too_big and isinstance(kept, list)
        core = EngineCore(Config(num_kvcache_blocks=8, kvcache_block_size=16), NullExecutor(8))
        with pytest.raises(InvalidRequestError, match="int32"):
            core.add_request(kept, SamplingParams(max_tokens=2))


def test_a_sequence_keeps_an_array_prompt_as_an_array() -> None:
    prompt = array("i", range(40))
    seq = Sequence(0, prompt, SamplingParams(max_tokens=4))
    prompt[0] = 99  # the sequence holds its own copy
    assert isinstance(seq.token_ids, array) and seq.token_ids[0] == 0
    seq.extend_tokens([7, 8])
    assert seq.block(2, 16).tolist() == [32, 33, 34, 35, 36, 37, 38, 39, 7, 8]
    assert seq.completion_token_ids.tolist() == [7, 8] and seq.last_token == 8


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_array_prompts_give_the_hashes_of_list_prompts(cost: CostModel, name: str) -> None:  # noqa: F811
    requests = poisson_requests(120, seed=3)
    whole = run_variant(workload_from_requests(requests, TIMING, "w"), CONFIGS[name], cost)
    kept = MemorySink()
    streamed = simulate_stream(WorkloadSource(requests, TIMING, "w"), CONFIGS[name], cost,
                               downstream=kept)
    assert whole.events is not None and streamed.ok
    mine = from_columns(kept.header, kept.tables).tables
    for kind, columns in HASH_COLUMNS.items():
        for column in columns:
            assert list(mine[kind][column]) == list(whole.events.tables[kind][column]), \
                f"{kind}.{column}"
    if CONFIGS[name].get("enable_prefix_caching", True):  # hashes and hits were compared
        assert len(whole.events.tables["block_hit"]["hash"]) > 0
        assert len(whole.events.tables["block_hashed"]["hash"]) > 0


def test_without_a_downstream_sink_prompts_are_not_copied(cost: CostModel) -> None:  # noqa: F811
    metrics = StreamingMetrics()
    assert not metrics.needs_prompt_tokens
    assert StreamingMetrics(downstream=MemorySink()).needs_prompt_tokens
    core = EngineCore(TIMING, NullExecutor(TIMING.num_kvcache_blocks), sink=metrics)
    core.add_request(array("i", range(20)), SamplingParams(max_tokens=2))
    assert core.events.tables["request_added"]["prompt_token_ids"] == [None]
    assert core.events.tables["request_added"]["prompt_len"] == [20]
    requests = poisson_requests(80, seed=6)
    alone = simulate_stream(WorkloadSource(requests, TIMING, "w"), {}, cost)
    relayed = simulate_stream(WorkloadSource(requests, TIMING, "w"), {}, cost,
                              downstream=MemorySink())
    assert [repr(v) for v in alone.metrics.values()] == \
        [repr(v) for v in relayed.metrics.values()]
