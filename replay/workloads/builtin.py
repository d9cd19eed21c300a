"""Workload generators: the reference "nano bench" workload and small demo workloads."""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine.sampling_params import SamplingParams

REFERENCE_NUM_SEQS = 256
REFERENCE_SEED = 0
REFERENCE_PROMPT_LEN = (100, 1024)
REFERENCE_MAX_TOKENS = (100, 1024)
REFERENCE_TOKEN_RANGE = (0, 10000)
REFERENCE_TEMPERATURE = 0.6


@dataclass(frozen=True)
class Request:
    """One request of a workload: the prompt (token ids, or text to tokenize), sampling settings
    and arrival time (seconds from the start of the run)."""

    prompt: list[int] | str
    max_tokens: int
    temperature: float = REFERENCE_TEMPERATURE
    ignore_eos: bool = True
    arrival_s: float = 0.0
    priority: int = 0  # lower is served first under policy "priority"

    def sampling_params(self) -> SamplingParams:
        """The engine's sampling settings for this request."""
        return SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens,
                              ignore_eos=self.ignore_eos)


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


def load_workload(path: str) -> list[Request]:
    """Read a JSONL workload: one request per line.

    Fields: ``prompt_token_ids`` (list of ints) or ``prompt`` (text, tokenized by the engine
    that runs it), ``max_tokens``, and optionally ``temperature``, ``ignore_eos``, ``arrival_s`` and
    ``priority``.
    """
    import json

    from engine.errors import InvalidRequestError

    requests: list[Request] = []
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.readlines()
    except OSError as exc:
        raise InvalidRequestError(f"cannot read workload {path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            prompt = item.get("prompt_token_ids")
            if prompt is None:
                prompt = str(item["prompt"])
            requests.append(
                Request(
                    prompt=prompt,
                    max_tokens=int(item["max_tokens"]),
                    temperature=float(item.get("temperature", REFERENCE_TEMPERATURE)),
                    ignore_eos=bool(item.get("ignore_eos", False)),
                    arrival_s=float(item.get("arrival_s", 0.0)),
                    priority=int(item.get("priority", 0)),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRequestError(f"{path}:{number}: bad workload line ({exc})") from None
    return requests


DEMO_BLOCK_SIZE = 16
DEMO_NUM_BLOCKS = 28
DEMO_MAX_MODEL_LEN = 512

_DEMO_PREFIX = (
    "You are a careful assistant for inference engineers. Answer in short sentences, cite the "
    "scheduler step that explains each latency spike, and never guess a figure that was not "
    "measured. The trace you are given was recorded on a small CPU model with random weights, "
    "so its text is meaningless but its scheduling decisions are real. "
)
_DEMO_QUESTIONS = [
    "Why was request seven preempted?",
    "Which blocks were shared between the first two prompts?",
    "How long did the longest prefill step take?",
    "What was the prefix cache hit rate?",
    "List the steps where the batch was all decode.",
    "Which request waited longest before its first token?",
]


def demo_workload() -> list[Request]:
    """Prompts that share a long system prefix (prefix-cache hits) and mix lengths."""
    requests = []
    for i, question in enumerate(_DEMO_QUESTIONS * 2):
        text = (_DEMO_PREFIX if i % 3 != 2 else "") + question
        requests.append(
            Request(text, max_tokens=24 + 8 * (i % 4), temperature=0.0, ignore_eos=True)
        )
    return requests
