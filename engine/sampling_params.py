"""Per-request sampling settings."""

from __future__ import annotations

import math
import numbers
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from engine.errors import InvalidRequestError
from tracing.schema import is_int32_array

INF = float("inf")
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
# The largest per-request seed (it is mixed with a token's index into a generator seed).
MAX_SEED = 2**63 - 1
# A temperature below this samples greedily (vLLM's rule): logits divided by a smaller one
# overflow float32, and the softmax of infinities is NaN.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. ``temperature == 0`` means greedy.

    ``top_p`` < 1 keeps the smallest set of tokens whose probability reaches it (nucleus);
    ``top_k`` > 0 keeps the k most likely tokens (0: all); ``seed`` makes the request's draws
    its own, so the same request with the same seed gets the same answer whatever it is batched
    with (None: draws come from the engine's generator). ``stop``: strings that end the answer
    when its text contains one (the text ends before it; checked on detokenized text outside
    the scheduler, which finishes the request with reason ``stop``). A temperature below
    ``GREEDY_BELOW`` is stored as 0 (greedy), so the trace records what was run.

    Invalid values raise ``InvalidRequestError`` (a ``ValueError``) naming the field.
    """

    temperature: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # numpy's numbers (a sweep's np.int64, np.float32) as the Python ones they stand for,
        # so every check below and the trace see plain values.
        real, integral = (numbers.Real, float), (numbers.Integral, int)
        for name, (kind, number) in (("temperature", real), ("top_p", real),
                                     ("max_tokens", integral), ("top_k", integral),
                                     ("seed", integral), ("ignore_eos", (np.bool_, bool))):
            object.__setattr__(self, name, _plain(getattr(self, name), kind, number))
        if not _is_number(self.temperature) or self.temperature in (INF, -INF):
            raise InvalidRequestError(
                f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        # Under the cut-off, greedy (a float32 may flush it to 0); the cut-off compared in
        # float32, as the trace holds both, so the run and its replay fall on one side.
        temperature = as_recorded(self.temperature, "temperature", underflow=True)
        object.__setattr__(self, "temperature",
                           0.0 if temperature < GREEDY_BELOW_RECORDED else temperature)
        if not isinstance(self.ignore_eos, bool):  # "false" or 0 would silently mean True/False
            raise InvalidRequestError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if not _is_int(self.max_tokens):
            raise InvalidRequestError(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        object.__setattr__(self, "top_p", as_recorded(self.top_p, "top_p"))
        if not _is_int(self.top_k) or not 0 <= self.top_k <= INT32_MAX:
            raise InvalidRequestError(
                f"top_k must be an integer in [0, {INT32_MAX}] (0: off), got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise InvalidRequestError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        stop = () if self.stop is None else self.stop  # vLLM's "no stop strings"
        if not isinstance(stop, str) and isinstance(stop, Iterable):
            stop = tuple(stop)  # once: a generator is read here, not emptied by the check
        if not isinstance(stop, tuple) or not all(isinstance(s, str) and s for s in stop):
            raise InvalidRequestError(f"stop must be a sequence of non-empty strings, got {stop!r}")
        object.__setattr__(self, "stop", stop)
        for text in self.stop:
            if not is_valid_text(text):  # a lone surrogate: no trace column can hold it
                raise InvalidRequestError(f"stop string {text!r} is not valid Unicode text")

    @property
    def needs_row_sampling(self) -> bool:
        """Whether a sampled token needs the per-row path (top-p, top-k or its own seed)."""
        return self.temperature > 0 and (
            self.top_p < 1 or self.top_k > 0 or self.seed is not None
        )


def as_recorded(value: float, name: str, underflow: bool = False) -> float:
    """``value`` as the trace's float32 columns hold it (``request_added.temperature`` and
    ``top_p``), so a run decides on what its replay reads back: a float64 that float32 rounds
    across a threshold would decide otherwise (a top_p of 0.99999999 filters, its float32 of
    1.0 does not; the greedy cut-off is compared in float32 for the same reason).
    ``InvalidRequestError`` where float32 cannot hold it at all (past its range: inf; a
    positive value under its smallest, 0, unless ``underflow`` takes that 0)."""
    recorded = array("f", (value,))[0]  # rounds as numpy's cast does, without its warning
    if not math.isfinite(recorded) or (value > 0 and recorded <= 0 and not underflow):
        raise InvalidRequestError(f"{name} {value!r} is outside what the trace's float32 column "
                                  "holds (1.4e-45 to 3.4e+38)")
    return recorded


# The cut-off as the trace's float32 holds it, which the run's temperatures are compared with.
GREEDY_BELOW_RECORDED = as_recorded(GREEDY_BELOW, "GREEDY_BELOW")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def is_valid_text(text: str) -> bool:
    """Whether UTF-8 (so a trace's string column) can hold ``text``: False for a string with a
    lone UTF-16 surrogate, which Python strings may carry (a ``\\ud800`` JSON escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plain(value: object, kind: type | tuple[type, ...], number: type) -> object:
    """``value`` as ``number`` where it is a numpy number of ``kind`` (a sweep's np.int64,
    np.float32, np.bool_), so checks and the trace see plain values; otherwise as it is."""
    if isinstance(value, kind) and not isinstance(value, (bool, int, float)):
        return number(value)
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_recordable(token_ids: list[int] | array, params: SamplingParams,
                     bounds: tuple[int, int] | None = None, priority: int = 0) -> int:
    """Raise ``InvalidRequestError`` for a request the trace's int32 columns cannot hold; return
    ``priority`` as a plain int (numpy's integers taken, as SamplingParams takes them).

    ``bounds``: the prompt's smallest and largest token id where the caller has them (the
    frontend's vocabulary check found them), so a long prompt is not scanned twice."""
    priority = _plain(priority, numbers.Integral, int)
    if not (_is_int(priority) and INT32_MIN <= priority <= INT32_MAX):
        raise InvalidRequestError(
            f"priority must be an integer in [{INT32_MIN}, {INT32_MAX}], got {priority!r}")
    if params.max_tokens > INT32_MAX:
        raise InvalidRequestError(f"max_tokens must be <= {INT32_MAX}, got {params.max_tokens}")
    if len(token_ids) > INT32_MAX:
        raise InvalidRequestError(f"a prompt may hold at most {INT32_MAX} tokens")
    # min/max run in C: cheap next to the request's own scheduling. An int32 array holds only
    # recordable values. A negative id or one past the vocabulary is recordable: such a request
    # is rejected (and recorded); only a value no int32 column holds is refused here.
    if is_int32_array(token_ids):
        return priority
    if token_ids and bounds is None:
        bounds = min(token_ids), max(token_ids)
    if token_ids and (bounds[0] < INT32_MIN or bounds[1] > INT32_MAX):
        bad = next(t for t in token_ids if not INT32_MIN <= t <= INT32_MAX)
        raise InvalidRequestError(f"token id {bad} does not fit a trace's int32 column")
    return priority


def check_arrival(arrival_s: float | None) -> None:
    """Raise ``InvalidRequestError`` unless ``arrival_s`` is None (now) or a finite number of
    seconds >= 0 on the engine's clock (seconds since the engine started, ``EngineCore.now``):
    NaN, an infinity or a negative time would be recorded as the request's arrival (a negative
    time to first token, an exported timeline decades long)."""
    if arrival_s is None:
        return
    number = (isinstance(arrival_s, (int, float)) and not isinstance(arrival_s, bool))
    if not (number and math.isfinite(arrival_s) and arrival_s >= 0):
        raise InvalidRequestError(
            f"arrival_s must be a finite number of seconds >= 0 on the engine's clock (seconds "
            f"since the engine started, as EngineCore.now() reads), got {arrival_s!r}")
