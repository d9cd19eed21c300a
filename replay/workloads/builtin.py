"""The workload request model, the reference "nano bench" workload and small demo workloads."""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine.sampling_params import SamplingParams
from replay.workloads.recipe import PromptRecipe

REFERENCE_NUM_SEQS = 256
REFERENCE_SEED = 0
REFERENCE_PROMPT_LEN = (100, 1024)
REFERENCE_MAX_TOKENS = (100, 1024)
REFERENCE_TOKEN_RANGE = (0, 10000)
REFERENCE_TEMPERATURE = 0.6


@dataclass(frozen=True)
class Request:
    """One request of a workload (docs/workloads.md, field by field).

    ``prompt``: token ids, text (tokenized by the engine that runs it) or a ``PromptRecipe``.
    ``arrival_s``: seconds from the start of the run (first turns only). A later turn of a
    conversation (``conversation_id`` set, ``turn`` >= 1) is sent ``think_time_s`` after the
    previous turn finished, its prompt the previous prompt, the previous answer and this
    ``prompt`` (the new user tokens). ``priority`` is carried for the scheduler.
    """

    prompt: list[int] | str | PromptRecipe
    max_tokens: int
    temperature: float = REFERENCE_TEMPERATURE
    ignore_eos: bool = True
    arrival_s: float = 0.0
    conversation_id: str | None = None
    turn: int = 0
    think_time_s: float = 0.0
    priority: int = 0

    @property
    def follows_previous_turn(self) -> bool:
        """Whether this request waits for the previous turn of its conversation."""
        return self.conversation_id is not None and self.turn > 0

    @property
    def prompt_len(self) -> int | None:
        """Prompt tokens (None for text, whose length the tokenizer decides)."""
        return None if isinstance(self.prompt, str) else len(self.prompt)

    def prompt_token_ids(self) -> list[int] | str:
        """The prompt as the engine takes it: token ids (a recipe materialised) or text."""
        if isinstance(self.prompt, PromptRecipe):
            return self.prompt.token_ids()
        return self.prompt

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


def load_workload(path: str, ignore_unknown_fields: bool = False) -> list[Request]:
    """Read a workload file (JSONL or Parquet, docs/workloads.md) whole, for a run.

    Raises ``WorkloadFormatError`` (an ``InvalidRequestError``) naming the file, line and field.
    """
    from replay.workloads.store import read_workload

    return list(read_workload(path, ignore_unknown_fields=ignore_unknown_fields))


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
