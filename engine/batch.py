"""What the scheduler hands the executor for one step, and what comes back."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sequence import Sequence


@dataclass
class ScheduledBatch:
    """The sequences of one step. Prefill work (whole prompts or chunks) comes first, decodes last.

    For sequence ``i``: the step computes tokens ``[context_lens[i] - num_new_tokens[i],
    context_lens[i])`` of ``seqs[i].token_ids``, reading the KV of the earlier ones through
    ``seqs[i].block_table``. Only sequences with ``sample[i]`` produce a token.
    """

    step: int
    kind: str
    seqs: list[Sequence]
    num_new_tokens: list[int]
    context_lens: list[int]
    num_prefill_seqs: int
    sample: list[bool] | None = None  # None: every sequence samples (the common case)
    num_batched_tokens: int = 0
    sampled_seqs: list[Sequence] = field(default_factory=list)
    # Scheduled and launched while the previous step was still on the device (its tokens not yet
    # back); set by EngineCore. Decided from scheduler state alone, so replay and simulation
    # reproduce it; a simulator charges such a step max(device, host) time instead of the sum.
    overlapped: bool = False
    # Run without CUDA graphs whatever the batch: the start-up calibration times what a step
    # costs eagerly (what a configuration without graphs pays); the scheduler never sets it.
    eager: bool = False

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def is_decode(self) -> bool:
        return self.num_prefill_seqs == 0


@dataclass
class StepOutput:
    """The executor's answer: one token per sampled sequence, in batch order, plus measurements."""

    token_ids: list[int]
    duration_s: float | None = None  # device time of the step where measured; None: use wall time
    padded_batch_size: int = 0
    graph_used: bool = False
    wait_s: float = 0.0  # host time spent blocked waiting for the device (not host work)
    # Tokens the forward computed, padding included (a CUDA-graph prefill's captured size);
    # 0: the step's own tokens.
    padded_tokens: int = 0


@dataclass
class StepResult:
    """What one step did: the batch, its output and the sequences that finished in it."""

    step: int
    batch: ScheduledBatch
    output: StepOutput
    finished: list[Sequence]
    duration_s: float


@dataclass
class StepWork:
    """The work of the step the scheduler is building: prompt chunks (admissions included) and
    decodes."""

    prefills: list[Sequence] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)


def batch_features(batch: ScheduledBatch) -> tuple[int, int, int, int]:
    """(prefill tokens, sum of query x context over prefill work, decode seqs, decode context)."""
    num_prefill = batch.num_prefill_seqs
    if num_prefill == 0:
        return 0, 0, len(batch.seqs), sum(batch.context_lens)
    new = batch.num_new_tokens[:num_prefill]
    ctx = batch.context_lens[:num_prefill]
    return (
        sum(new),
        sum(q * c for q, c in zip(new, ctx)),
        len(batch.seqs) - num_prefill,
        sum(batch.context_lens[num_prefill:]),
    )
