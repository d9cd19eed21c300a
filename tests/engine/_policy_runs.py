"""A user policy's one ``policy`` violation on a two-request workload (the policy tests')."""

from __future__ import annotations

from engine.config import Config
from replay.testing import RequestSpec, Workload, run_workload


def policy_violation(policy: str) -> str:
    """The one ``policy`` violation of a run of two short requests under ``policy``."""
    config = Config(policy=policy, kvcache_block_size=2, num_kvcache_blocks=8, max_model_len=16,
                    max_num_batched_tokens=16, eos=-1)
    workload = Workload(config, (RequestSpec(0, (1, 2, 3), 2, True, (3, 3)),
                                 RequestSpec(0, (4, 5), 2, True, (3, 3))))
    (message,) = run_workload(workload).violations["policy"]
    return message
