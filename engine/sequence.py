"""A request as the scheduler sees it: its tokens, its KV blocks and its progress."""

from __future__ import annotations

from array import array
from enum import Enum

from engine.sampling_params import SamplingParams
from tracing.schema import NO_SEED

# The token an overlapped step will sample, appended before its value is back from the device
# (engine/engine_core.py); the scheduler writes the value in when the step resolves.
PENDING_TOKEN = -1
# The typecode of a sequence held as an int32 array (``array('i')``: a C int, 32 bits where this
# engine runs; ``engine.block_manager`` checks it).
TOKEN_TYPECODE = "i"


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request. ``seq_id`` is given by the engine's own counter, never by a global one.

    ``num_cached_tokens`` counts prompt tokens served from the prefix cache at admission;
    ``num_computed_tokens`` counts tokens whose KV is in the cache (or is being written this step).

    ``token_ids`` is a list of ints, or an int32 ``array('i')`` where the request came as one (the
    streaming simulator's prompts): its blocks then hash and compare without a conversion per
    token. Both behave alike (index, slice, append, extend); an engine's sequences should all
    take one form, since a block of one form never equals a block of the other (no cache hit).
    """

    __slots__ = (
        "seq_id",
        "status",
        "token_ids",
        "last_token",
        "num_tokens",
        "num_prompt_tokens",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_hashed_blocks",
        "block_table",
        "temperature",
        "max_tokens",
        "ignore_eos",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "row_sampling",
        "arrival_s",
        "finish_reason",
        "num_preemptions",
        "priority",
    )

    def __init__(
        self,
        seq_id: int,
        token_ids: list[int] | array,
        params: SamplingParams,
        arrival_s: float = 0.0,
    ) -> None:
        self.seq_id = seq_id
        self.status = SequenceStatus.WAITING
        self.token_ids: list[int] | array = (
            array(TOKEN_TYPECODE, token_ids) if isinstance(token_ids, array) else list(token_ids)
        )
        self.last_token = self.token_ids[-1] if self.token_ids else -1
        self.num_tokens = len(self.token_ids)
        self.num_prompt_tokens = self.num_tokens
        self.num_cached_tokens = 0
        self.num_computed_tokens = 0
        self.num_hashed_blocks = 0
        self.block_table: list[int] = []
        self.temperature = float(params.temperature)
        self.max_tokens = params.max_tokens
        self.ignore_eos = params.ignore_eos
        self.top_p = float(params.top_p)
        self.top_k = params.top_k
        self.seed = NO_SEED if params.seed is None else params.seed
        self.stop = params.stop
        # (top_p, top_k, seed) for the sampler's per-row path; None: the batched path serves it.
        self.row_sampling = (
            (self.top_p, self.top_k, self.seed) if params.needs_row_sampling else None
        )
        self.arrival_s = arrival_s
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.priority = 0  # set by ``Scheduler.add``: lower is served first

    def __len__(self) -> int:
        return self.num_tokens

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, status={self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )

    @property
    def num_completion_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int] | array:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def completion_token_ids(self) -> list[int] | array:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def block(self, index: int, block_size: int) -> list[int] | array:
        """The token ids of logical block ``index`` (the one place a block's tokens are sliced),
        in ``token_ids``' form."""
        return self.token_ids[index * block_size : (index + 1) * block_size]

    def append_token(self, token_id: int) -> None:
        """Append a sampled token (``PENDING_TOKEN`` while its value is on the device); every
        token before it has its KV computed by then."""
        self.num_computed_tokens = self.num_tokens
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1

    def extend_tokens(self, token_ids: list[int] | array) -> None:
        """``append_token`` for each of ``token_ids`` in turn (none pending), in one call."""
        if token_ids:
            self.token_ids.extend(token_ids)
            self.last_token = token_ids[-1]
            self.num_tokens += len(token_ids)
            self.num_computed_tokens = self.num_tokens - 1

