"""Arrival processes of generated workloads, with the peers' semantics.

``gamma`` is ``vllm bench serve --burstiness`` (and NVIDIA AIPerf's ``--arrival-smoothness``):
inter-arrival times are Gamma with shape ``burstiness`` and scale ``1 / (rate * burstiness)``, so
their mean is ``1 / rate`` and their coefficient of variation ``1 / sqrt(burstiness)``;
burstiness 1 is Poisson (exponential gaps), below 1 burstier, above 1 more regular. ``constant``
spaces arrivals ``1 / rate`` apart; ``schedule`` reads one arrival time (seconds) a line. The
first request arrives at 0 and each later one a gap after the previous one, as in vLLM. No
process named (``kind`` None, the default) is Poisson, and without a rate everything at 0; a
process named without a rate is an error (it would change nothing). An infinite rate sends
everything at 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from engine.errors import InvalidRequestError
from replay.workloads.text_input import numbers

PROCESSES = ("constant", "poisson", "gamma", "schedule")
CHUNK = 65536


@dataclass(frozen=True)
class ArrivalProcess:
    """How first turns arrive: ``kind`` (PROCESSES; None, the default, is ``poisson`` and may
    go without a rate, set by __post_init__), ``rate`` (requests/s), ``burstiness`` (the Gamma
    shape; Poisson is 1), ``schedule`` (a file of arrival times)."""

    kind: str | None = None
    rate: float | None = None
    burstiness: float = 1.0
    schedule: str | None = None

    def __post_init__(self) -> None:
        named = self.kind is not None
        if not named:  # the default: Poisson, everything at 0 without a rate
            object.__setattr__(self, "kind", "poisson")
        if self.kind not in PROCESSES:
            raise InvalidRequestError(f"arrivals: unknown process {self.kind!r}; one of "
                                      f"{', '.join(PROCESSES)}")
        if self.rate is not None and not (self.rate > 0):
            raise InvalidRequestError(f"--rate must be > 0, got {self.rate}")
        if not (math.isfinite(self.burstiness) and self.burstiness > 0):
            raise InvalidRequestError(f"--burstiness must be > 0, got {self.burstiness}")
        if self.kind == "schedule" and not self.schedule:
            raise InvalidRequestError("arrivals 'schedule' needs --schedule FILE")
        # Options that the process would ignore are contradictions, not defaults.
        if self.schedule and self.kind != "schedule":
            raise InvalidRequestError("--schedule needs --arrivals schedule"
                                      + (f", not {self.kind}" if named else ""))
        if self.kind == "schedule" and self.rate is not None:
            raise InvalidRequestError("--rate does not apply to --arrivals schedule (its file "
                                      "gives the times)")
        if named and self.kind != "schedule" and self.rate is None:
            raise InvalidRequestError(f"--arrivals {self.kind} needs --rate (without one every "
                                      "request arrives at 0)")
        if self.kind != "gamma" and self.burstiness != 1.0:
            raise InvalidRequestError("--burstiness applies to --arrivals gamma"
                                      + (f", not {self.kind}" if named else ""))

    @property
    def shape(self) -> float:
        return {"poisson": 1.0, "gamma": self.burstiness}.get(self.kind, math.inf)

    def times(self, n: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
        """``n`` arrival times (seconds), in chunks, non-decreasing."""
        if self.kind == "schedule":
            yield from _schedule(self.schedule or "", n)
            return
        start = 0.0
        for first in range(0, n, CHUNK):
            size = min(CHUNK, n - first)
            if self.rate is None or math.isinf(self.rate):
                yield np.zeros(size)
                continue
            if self.kind == "constant":
                gaps = np.full(size, 1.0 / self.rate)
            else:
                gaps = rng.gamma(self.shape, 1.0 / (self.rate * self.shape), size)
            if first == 0:
                gaps[0] = 0.0  # the first request goes at once
            times = start + np.cumsum(gaps)
            if not np.isfinite(times[-1]):
                raise InvalidRequestError(f"--rate {self.rate:g}"
                                          + (f" --burstiness {self.burstiness:g}"
                                             if self.kind == "gamma" else "")
                                          + " makes arrival times overflow")
            start = float(times[-1])
            yield times


def _schedule(path: str, n: int) -> Iterator[np.ndarray]:
    """The first ``n`` times of the file, in chunks of ``CHUNK``: reading stops there (a file
    longer than needed is neither read to its end nor checked past them)."""
    times: list[float] = []
    last, count = -math.inf, 0
    for where, value in numbers(path, "--schedule"):
        if not math.isfinite(value) or value < 0:
            raise InvalidRequestError(f"{where}: a time must be finite and >= 0, got {value:g}")
        if value < last:
            raise InvalidRequestError(f"{where}: {value:g} is before the time above it "
                                      f"({last:g}): arrival times must not decrease")
        times.append(value)
        last, count = value, count + 1
        if len(times) == CHUNK or count == n:
            yield np.asarray(times)
            times = []
        if count == n:
            return
    raise InvalidRequestError(f"{path}: {count} arrival times for {n} requests")
