"""Per-request sampling settings."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. ``temperature == 0`` means greedy.

    Invalid values raise ``InvalidRequestError`` (a ``ValueError``) naming the field.
    """

    temperature: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature != self.temperature:
            raise InvalidRequestError(f"temperature must be a number, got {self.temperature!r}")
        if self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidRequestError(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be >= 1, got {self.max_tokens}")
