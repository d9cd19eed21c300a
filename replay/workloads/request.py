"""One request of a workload: the model every consumer shares (run, whatif, loadgen, the API)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.sampling_params import SamplingParams
from replay.workloads.recipe import PromptRecipe

# The default temperature: the reference workload's (DESIGN.md).
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
