"""What an import keeps and how (``ImportOptions``), what it dropped or changed
(``ImportCounts``), and the one way an imported row becomes a request (``make_request``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from engine.errors import InvalidRequestError
from replay.workloads.fields import INT32_MAX, MAX_TOKENS_LIMIT, check_temperature
from replay.workloads.recipe import PromptRecipe
from replay.workloads.request import REFERENCE_TEMPERATURE, Request

OVER_LENGTH = ("drop", "clip")
SALT_STRIDE = 1 << 40
# A trace's token count must lie in [0, COUNT_LIMIT] (else the row is malformed); ``select``
# then drops or clips a prompt over MAX_TOKENS_LIMIT and clips such an output length, counted.
COUNT_LIMIT = INT32_MAX
MOONCAKE_BLOCK_SIZE = 512  # tokens per hash_ids entry where --block-size is not given
# Why ``select`` drops a request it reads (``Gate``; a later turn goes with its first turn).
OUTSIDE, LATER_TURN = "outside the time window", "later turn of a conversation not kept"


@dataclass(frozen=True)
class ImportOptions:
    """What to keep and how: the window is in the trace's seconds (from its first request),
    before ``time_scale``; kept arrivals are rebased to the window start, then scaled, and
    think times of later turns are scaled alike (every time of the traffic)."""

    start_s: float = 0.0
    end_s: float = math.inf
    limit: int | None = None
    time_scale: float = 1.0  # times of the traffic are multiplied by it (0.5: twice as fast)
    max_prompt_len: int | None = None
    over_length: str = "drop"  # "drop" or "clip" prompts over max_prompt_len
    seed: int = 0
    block_size: int | None = None  # mooncake: tokens per hash_ids entry (None: 512)
    temperature: float = REFERENCE_TEMPERATURE
    ignore_eos: bool = True  # a trace's output lengths are only honoured with ignore_eos
    ignore_unknown_fields: bool = False
    model: str | None = None  # sharegpt: tokenizer directory (None: the tiny model's)
    rate: float | None = None  # sharegpt: conversations per second (None: all at 0)
    filter_model: str | None = None  # burstgpt: keep the rows of this Model only (None: all)

    def __post_init__(self) -> None:
        if not (self.start_s >= 0 and self.end_s > self.start_s):
            raise InvalidRequestError(f"the time window must have 0 <= start < end, got "
                                      f"[{self.start_s}, {self.end_s})")
        if self.limit is not None and self.limit < 1:
            raise InvalidRequestError(f"--limit must be >= 1, got {self.limit}")
        if not (math.isfinite(self.time_scale) and self.time_scale >= 0):
            raise InvalidRequestError(f"--time-scale must be a finite number >= 0, got "
                                      f"{self.time_scale}")
        # 0 sends everything at once; -0.0 is that 0, not arrivals written as -0.0
        object.__setattr__(self, "time_scale", self.time_scale + 0.0)
        if self.max_prompt_len is not None and not 1 <= self.max_prompt_len <= MAX_TOKENS_LIMIT:
            raise InvalidRequestError(f"--max-prompt-len must be in [1, {MAX_TOKENS_LIMIT}]")
        if self.over_length not in OVER_LENGTH:
            raise InvalidRequestError(f"--over-length must be drop or clip, got "
                                      f"{self.over_length!r}")
        if self.block_size is not None and not 1 <= self.block_size <= MAX_TOKENS_LIMIT:
            raise InvalidRequestError(f"--block-size must be in [1, {MAX_TOKENS_LIMIT}], got "
                                      f"{self.block_size}")
        if not 0 <= self.seed < 1 << 20:
            raise InvalidRequestError(f"--seed must be in [0, {1 << 20})")
        check_temperature(self.temperature)
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise InvalidRequestError(f"--rate must be finite and > 0, got {self.rate}")
        if self.filter_model is not None and not self.filter_model.strip():
            raise InvalidRequestError("--filter-model must name a model (BurstGPT's: ChatGPT, "
                                      "GPT-4)")


class Gate:
    """What ``select`` will drop of a first turn by its time or by ``--limit`` alone, whatever
    the request: a source asks before building a costly one (ShareGPT's tokenizing is nearly
    all of its import's time) and yields the reason instead. ``first_turns``: kept so far;
    ``in_conversation``: whether a kept request belongs to a conversation (its later turns may
    follow). A source whose rows are in time order asks ``closed`` after each row and stops
    reading where no later row can be kept (``stop``: where and why, for ``ImportCounts``)."""

    def __init__(self, options: ImportOptions) -> None:
        self.options, self.first_turns, self.in_conversation = options, 0, False
        self.stopped: str | None = None

    def drops(self, seconds: float) -> str | None:
        """Why a first turn arriving at ``seconds`` of the trace, read now, is dropped, if it
        is, whatever it holds."""
        options = self.options
        if not options.start_s <= seconds < options.end_s:
            return OUTSIDE
        if options.limit is not None and self.first_turns >= options.limit:
            return f"beyond --limit {options.limit}"
        return None

    def full(self) -> str | None:
        """Why no first turn read from now on is kept, if ``--limit`` first turns are."""
        limit = self.options.limit
        if limit is not None and self.first_turns >= limit:
            return f"--limit {limit} first turns kept"
        return None

    def closed(self, seconds: float) -> str | None:
        """Why no first turn arriving at ``seconds`` of the trace or later, read from now on, is
        kept (``full``, or ``seconds`` at or past ``--end``), if none is; None while none is kept
        yet: such an import keeps nothing whatever follows, and reads on for the error naming
        the whole trace's span (``select``)."""
        if not self.first_turns:
            return None
        if seconds < self.options.end_s:
            return self.full()
        return (f"it arrives at {seconds:g} s of the trace, at or after --end "
                f"{self.options.end_s:g}, and rows are in time order")

    def stop(self, where: str, why: str) -> None:
        """Record that the source stopped reading after the row at ``where``, for ``why``."""
        self.stopped = (f"stopped reading at {where} ({why}): no later row could be kept; "
                        "the rows after it are neither counted nor checked")


@dataclass
class ImportCounts:
    """Every request read, kept, dropped (by reason) or changed (by what); ``stopped``: where
    and why the source stopped reading before its end (``Gate.stop``), None if it read all."""

    read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    changed: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None

    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` requests dropped for ``reason``."""
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    def change(self, what: str) -> None:
        """Count one request changed (``what``: how)."""
        self.changed[what] = self.changed.get(what, 0) + 1

    def to_dict(self) -> dict[str, object]:
        """The counts for a workload file's header (``stopped`` only where reading stopped)."""
        counts = asdict(self)
        if self.stopped is None:
            del counts["stopped"]
        return counts

    def describe(self) -> str:
        """The counts in one line (the import's summary), where reading stopped last."""
        parts = [f"read {self.read:,}", f"kept {self.kept:,}"]
        parts += [f"dropped {n:,} ({why})" for why, n in sorted(self.dropped.items())]
        parts += [f"{what}: {n:,}" for what, n in sorted(self.changed.items())]
        return ", ".join(parts) + (f"; {self.stopped}" if self.stopped else "")


def make_request(prompt: PromptRecipe | list[int], output_len: int, options: ImportOptions,
             **extra: object) -> Request:
    return Request(prompt, output_len, options.temperature, options.ignore_eos,
                   **extra)  # type: ignore[arg-type]
