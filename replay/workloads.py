"""Workload generators: the reference "nano bench" workload and small demo workloads."""

from __future__ import annotations

import random
from dataclasses import dataclass

REFERENCE_NUM_SEQS = 256
REFERENCE_SEED = 0
REFERENCE_PROMPT_LEN = (100, 1024)
REFERENCE_MAX_TOKENS = (100, 1024)
REFERENCE_TOKEN_RANGE = (0, 10000)
REFERENCE_TEMPERATURE = 0.6


@dataclass(frozen=True)
class Request:
    """One request of a workload: prompt tokens, sampling settings and arrival time."""

    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float = REFERENCE_TEMPERATURE
    ignore_eos: bool = True
    arrival_s: float = 0.0


def reference_workload(num_seqs: int = REFERENCE_NUM_SEQS) -> list[Request]:
    """DESIGN.md's reference workload: 256 random prompts, ignore_eos, temperature 0.6.

    With the defaults: 142,827 prompt tokens and 133,966 output tokens.
    """
    rng = random.Random(REFERENCE_SEED)
    # The draw order (all prompts first, then all max_tokens) is Nano-vLLM's bench.py order.
    prompts = [
        [rng.randint(*REFERENCE_TOKEN_RANGE) for _ in range(rng.randint(*REFERENCE_PROMPT_LEN))]
        for _ in range(num_seqs)
    ]
    max_tokens = [rng.randint(*REFERENCE_MAX_TOKENS) for _ in range(num_seqs)]
    return [Request(p, m) for p, m in zip(prompts, max_tokens)]
