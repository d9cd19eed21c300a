"""The live loop's own work on an arrival: adding a request takes host time.

``EngineCore.add_request`` checks the prompt's token ids, builds the sequence, queues it and
records its ``request_added`` event (the prompt copied in): work per request and per prompt
token, done on the engine's thread between two steps, so the next step starts that much later.
A batch of 256 prompts takes milliseconds to add, which every one of its requests waits before
its prefill starts (its TTFT counts from its arrival).

Measured on the engine's own stamps of each add: ``request_added.added_s`` (schema 7: every
request, whatever ``arrival_s`` the driver gave), or, in an older trace, ``arrival_s`` where the
engine stamped it (no ``arrival_s`` passed). Consecutive requests added before one step then lie
the time of one add apart, the driver's work for the next one included (building its prompt).
An older source whose arrivals are a workload's own times shows no such spacing (its stamps are
equal, or as far apart as the workload put them) and measures nothing (``AddCost()``: free).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from replay.recorded import RecordedEvents

# Stamps of one step's requests lie one add apart only if (nearly) every gap is tiny: gaps above
# this, beyond a stray one in twenty, are a workload's own spacing, not the engine's work.
MAX_ADD_GAP_S = 5e-4
ADD_GAP_QUANTILE = 0.95
MIN_ADDS = 16  # gaps needed to measure the cost (fewer: nothing measured)
# Of the engine's own stamps, a gap this many times the median holds more than one add's work
# (a wait for an arrival after a rejected request, a collector pause): left out.
STALL_GAP_FACTOR = 10.0


@dataclass(frozen=True)
class AddCost:
    """Host seconds the live loop spends adding one request: ``per_request_s`` plus
    ``per_token_s`` a prompt token; ``samples``: the adds it was measured on (0: not measured)."""

    per_request_s: float = 0.0
    per_token_s: float = 0.0
    samples: int = 0

    def seconds(self, prompt_tokens: int) -> float:
        return self.per_request_s + self.per_token_s * prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AddCost:
        return cls(**data)


def engine_add_stamps(events: RecordedEvents) -> np.ndarray | None:
    """Each request's ``added_s`` where the trace recorded it for every request, else None."""
    added = events.tables["request_added"]
    if "added_s" not in added:
        return None
    stamps = np.asarray(added["added_s"], dtype=float)
    return stamps if len(stamps) and bool(np.isfinite(stamps).all()) else None


def add_stamps(events: RecordedEvents) -> tuple[np.ndarray, bool]:
    """Each request's add stamp: its ``engine_add_stamps`` (True), else its ``arrival_s``
    (False: the engine's own only where it stamped them)."""
    own = engine_add_stamps(events)
    if own is not None:
        return own, True
    return np.asarray(events.tables["request_added"]["arrival_s"], dtype=float), False


def add_gaps(events: RecordedEvents) -> tuple[np.ndarray, np.ndarray]:
    """The gaps between the stamps of consecutive requests added before the same step
    (seconds), and the mean prompt length of each pair (a gap holds the end of one add and the
    start of the next): of ``engine_add_stamps`` (stalls left out: ``STALL_GAP_FACTOR``), else
    of ``arrival_s``, empty where those are not the engine's own (``MAX_ADD_GAP_S``)."""
    added = events.tables["request_added"]
    stamps, own = add_stamps(events)
    steps = np.asarray(added["step"], dtype=np.int64)
    lengths = np.asarray(added["prompt_len"], dtype=float)
    same = steps[1:] == steps[:-1]
    gaps = np.diff(stamps)[same]
    pairs = ((lengths[1:] + lengths[:-1]) / 2)[same]
    if own and len(gaps):
        keep = (gaps > 0) & (gaps <= STALL_GAP_FACTOR * max(float(np.median(gaps)), 0.0))
        gaps, pairs = gaps[keep], pairs[keep]
    if len(gaps) < MIN_ADDS or (not own and ((gaps <= 0).any() or float(
            np.quantile(gaps, ADD_GAP_QUANTILE)) > MAX_ADD_GAP_S)):
        return np.zeros(0), np.zeros(0)
    return gaps, pairs


def fit_add_cost(events: RecordedEvents) -> AddCost:
    """The cost of adding a request on the source (``add_gaps``): least squares of the gaps on
    the prompt length, both terms non-negative (the mean gap where the slope comes out
    negative)."""
    gaps, lengths = add_gaps(events)
    if not len(gaps):
        return AddCost()
    slope, intercept = np.polyfit(lengths, gaps, 1) if np.ptp(lengths) > 0 else (0.0, 0.0)
    if slope <= 0 or intercept <= 0:
        slope, intercept = 0.0, float(gaps.mean())
    return AddCost(float(intercept), float(slope), len(gaps))


def adds_within(events: RecordedEvents, add: AddCost, steps: np.ndarray,
                began: np.ndarray) -> np.ndarray:
    """Per model step (``steps``: their step numbers, ``began``: where each one's interval
    starts), the seconds ``add`` charges the requests added before it from that start on (by
    their ``engine_add_stamps``, else their ``arrival_s``): the adds the step's recorded interval
    holds."""
    added = events.tables["request_added"]
    out = np.zeros(len(steps))
    if not len(steps) or not len(added["step"]):
        return out
    stamps, _ = add_stamps(events)
    rows = np.searchsorted(steps, np.asarray(added["step"], dtype=np.int64))
    ok = rows < len(steps)
    ok[ok] &= stamps[ok] >= began[rows[ok]]
    charge = add.per_request_s + add.per_token_s * np.asarray(added["prompt_len"], dtype=float)
    np.add.at(out, rows[ok], charge[ok])
    return out
