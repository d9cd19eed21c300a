"""Length and time distributions of generated workloads, parsed from short specs.

Specs (docs/workloads.md): ``fixed:V``, ``uniform:LO,HI`` (inclusive), ``normal:MEAN,STD``,
``lognormal:MEAN,SIGMA`` (MEAN of the values, SIGMA of their logarithm), ``zipf:A,MAX`` (value
``k`` in 1..MAX with probability proportional to ``k**-A``), ``exponential:MEAN``, and
``empirical:FILE`` (values drawn uniformly from a file of one number a line). Integer draws
(lengths) round and are clipped into [1, ``upper``]; the clip counts are kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine.errors import InvalidRequestError
from replay.workloads.text_input import numbers

KINDS = ("fixed", "uniform", "normal", "lognormal", "zipf", "exponential", "empirical")
ZIPF_MAX_SUPPORT = 1 << 22
UNIFORM_MAX = 1 << 53  # uniform bounds: integers a float holds exactly
# empirical:FILE keeps every value (a draw may pick any): at most this many (~0.5 GB as a
# tuple); a larger file is refused once past it, not read to its end first.
MAX_EMPIRICAL_VALUES = 1 << 24
_ARITY = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2, "zipf": 2, "exponential": 1}


class SpecError(InvalidRequestError):
    """A distribution spec cannot be parsed or is out of range."""


@dataclass(frozen=True)
class Distribution:
    """A parsed spec; ``sample(rng, n)`` draws ``n`` floats."""

    kind: str
    params: tuple[float, ...] = ()
    values: tuple[float, ...] = ()  # empirical: the file's values
    text: str = ""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = self.params
        if self.kind == "fixed":
            return np.full(n, p[0], dtype=float)
        if self.kind == "uniform":
            return rng.integers(int(p[0]), int(p[1]) + 1, n).astype(float)
        if self.kind == "normal":
            return rng.normal(p[0], p[1], n)
        if self.kind == "lognormal":  # mean of the values p[0]: mu = log(mean) - sigma^2 / 2
            return rng.lognormal(math.log(p[0]) - p[1] ** 2 / 2, p[1], n)
        if self.kind == "exponential":
            return rng.exponential(p[0], n)
        if self.kind == "zipf":
            support = np.arange(1, int(p[1]) + 1, dtype=float)
            weights = support ** -p[0]
            return rng.choice(support, n, p=weights / weights.sum())
        return rng.choice(np.asarray(self.values, dtype=float), n)

    @property
    def support(self) -> tuple[float, float]:
        """The least and greatest value a draw can take (before rounding and clipping)."""
        p = self.params
        if self.kind == "fixed":
            return p[0], p[0]
        if self.kind == "uniform":
            return p[0], p[1]
        if self.kind == "zipf":
            return 1.0, p[1]
        if self.kind == "empirical":
            return min(self.values), max(self.values)
        spread = p[-1] if self.kind in ("normal", "lognormal") else p[0]
        if not spread:  # std, sigma or mean 0: every draw is the same value
            return (p[0], p[0]) if self.kind != "exponential" else (0.0, 0.0)
        return (-math.inf if self.kind == "normal" else 0.0), math.inf

    @property
    def mean(self) -> float:
        """The distribution's mean before rounding and clipping."""
        p = self.params
        if self.kind in ("fixed", "lognormal", "normal", "exponential"):
            return p[0]
        if self.kind == "uniform":
            return (p[0] + p[1]) / 2
        if self.kind == "zipf":
            support = np.arange(1, int(p[1]) + 1, dtype=float)
            weights = support ** -p[0]
            return float((support * weights).sum() / weights.sum())
        return float(np.mean(self.values))


def parse(spec: str, what: str = "distribution") -> Distribution:
    """Parse ``KIND:ARGS`` (module docstring); raises SpecError naming ``what``."""
    kind, _, args = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise SpecError(f"{what}: unknown distribution {kind!r} in {spec!r}; one of "
                        f"{', '.join(KINDS)}")
    if kind == "empirical":
        return _empirical(args, what, spec)
    try:
        params = tuple(float(x) for x in args.split(","))
    except ValueError:
        raise SpecError(f"{what}: {spec!r}: arguments must be numbers") from None
    if len(params) != _ARITY[kind] or not all(math.isfinite(x) for x in params):
        raise SpecError(f"{what}: {spec!r}: {kind} takes {_ARITY[kind]} finite number(s)")
    checks = {
        "fixed": lambda p: p[0] < 0,
        "uniform": lambda p: p[0] < 0 or p[1] < p[0],
        "normal": lambda p: p[1] < 0,
        "lognormal": lambda p: p[0] <= 0 or p[1] < 0,
        "zipf": lambda p: p[0] <= 0 or p[1] < 1 or p[1] > ZIPF_MAX_SUPPORT,
        "exponential": lambda p: p[0] < 0,
    }
    if checks[kind](params):
        raise SpecError(f"{what}: {spec!r}: parameters out of range (docs/workloads.md)")
    if kind == "uniform" and not all(x == int(x) and x <= UNIFORM_MAX for x in params):
        raise SpecError(f"{what}: {spec!r}: uniform takes integers LO,HI in [0, {UNIFORM_MAX}] "
                        "(its draws are integers)")
    return Distribution(kind, params, text=spec)


def _empirical(path: str, what: str, spec: str) -> Distribution:
    values = []
    for where, value in numbers(path, what):
        if not math.isfinite(value) or value < 0:
            raise SpecError(f"{where}: must be finite and >= 0, got {value:g}")
        values.append(value)
        if len(values) > MAX_EMPIRICAL_VALUES:
            raise SpecError(f"{what}: {path} holds more than {MAX_EMPIRICAL_VALUES:,} values "
                            "(all are kept in memory): sample it down")
    if not values:
        raise SpecError(f"{what}: {path} holds no values")
    return Distribution("empirical", values=tuple(values), text=spec)


class IntDraws:
    """Integer draws from a Distribution, clipped into [1, ``upper``], counting the clips."""

    def __init__(self, dist: Distribution, upper: int, what: str = "distribution") -> None:
        low, high = dist.support
        if np.rint(high) < 1 or np.rint(low) > upper:  # clipping would change every draw
            raise SpecError(f"{what}: {dist.text or dist.kind!r}: every value lies outside "
                            f"[1, {upper}]")
        self.dist, self.upper = dist, upper
        self.clipped_low = self.clipped_high = 0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raw = np.rint(self.dist.sample(rng, n))
        self.clipped_low += int((raw < 1).sum())
        self.clipped_high += int((raw > self.upper).sum())
        return np.clip(raw, 1, self.upper).astype(np.int64)
