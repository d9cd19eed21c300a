"""Conservation of a simulated workload, on Hypothesis-generated workloads and configs.

Every request of a workload file (token ids, ``ignore_eos``: decisions independent of token
values) finishes in the simulation with exactly its ``max_tokens`` tokens, and a KV pool that
holds every request whole at once (prompt plus answer, each rounded up to whole blocks) never
preempts, whatever the block size, ``max_num_seqs``, policy and prefix caching. (More blocks
*can* cause more preemptions: with ``max_num_seqs=1``, three requests of 9 prompt tokens and
9, 2, 2 answer tokens on 8-token blocks (prefix caching off) preempt once with 6 blocks and
never with 5, since a larger pool admits more requests at once. That is the engine's admission
rule, not a property the what-if may assume, so no such monotonicity is tested.)
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import Config
from replay.whatif.simulate import run_variant, workload_from_requests
from replay.workloads.request import Request

REQUESTS = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 40), st.integers(0, 3)),
                    min_size=1, max_size=10)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(REQUESTS, st.sampled_from([4, 8, 16]), st.integers(1, 8), st.booleans(),
       st.sampled_from(["prefill_first", "chunked"]))
def test_a_pool_holding_every_request_never_preempts(requests, block_size, max_num_seqs,
                                                     prefix_caching, policy):
    """Each request (a 10-token prefix of one of 4 kinds, then its own tokens) finishes with
    its ``max_tokens`` tokens, reason ``length``, and no step preempts."""
    workload = [Request([kind + 1] * 10 + list(range(1, length + 1)), max_tokens=answer,
                        ignore_eos=True) for length, answer, kind in requests]
    blocks = sum(-(-(len(r.prompt) + r.max_tokens) // block_size) for r in workload)
    config = Config(kvcache_block_size=block_size, num_kvcache_blocks=blocks, max_model_len=128,
                    max_num_batched_tokens=128 if policy == "prefill_first" else 32,
                    max_num_seqs=max_num_seqs, enable_prefix_caching=prefix_caching,
                    policy=policy)
    result = run_variant(workload_from_requests(workload, config, "generated"), {}, None)
    assert result.ok, result.status
    assert result.metrics["preemptions"] == 0
    assert result.requests["completion_tokens"].tolist() == [r.max_tokens for r in workload]
    assert set(result.requests["finish_reason"]) == {"length"}
