"""A step's features and the linear form of a class's time (``LinearFit``).

``StepFeatures`` are what the step-time model prices, each with a physical meaning (tokens for
the GEMMs' FLOPs and weight reads, ``prefill_attn_work`` for attention FLOPs, KV tokens read,
the longest attention programs, sequences, padding); a class's time is linear in them, bounded
below by a launch floor, plus the prefill attention's roofline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul
from typing import Any, NamedTuple

import numpy as np


class StepFeatures(NamedTuple):
    """One step's batch features, in the order of every coefficient vector (``FEATURES``)."""

    num_seqs: float
    prefill_tokens: float
    prefill_attn_work: float
    decode_seqs: float
    decode_context_tokens: float
    padded_batch_size: float
    # The tokens the forward computed (``computed_tokens``): not a column of older traces.
    padded_tokens: float
    # Derived, not recorded (``decode_features``): the decode rows' KV tokens read from memory,
    # a block shared by several rows (a common prefix) counted once, since the other rows read
    # it from L2; and the KV tokens of the longest attention program (the longest decode
    # context over the kernel's splits), which bounds the kernel's last wave.
    decode_kv_tokens: float
    decode_longest_tokens: float
    # Derived: the longest prefill context (a prompt's new tokens over its cached prefix): the
    # keys the prefill kernel's longest program reads.
    prefill_longest_tokens: float


FEATURES: tuple[str, ...] = StepFeatures._fields
PADDED_TOKENS = "padded_tokens"
RECORDED_FEATURES = FEATURES[:FEATURES.index(PADDED_TOKENS)]
PREFILL_LONGEST = "prefill_longest_tokens"
MIN_STEP_S = 1e-6  # a step always takes some time (a fit may extrapolate to <= 0)
_WORK, _LONGEST_AT = FEATURES.index("prefill_attn_work"), FEATURES.index(PREFILL_LONGEST)
_PADDED_AT = FEATURES.index("padded_batch_size")


def route_of(padded: float, routes: Sequence[int]) -> int:
    """The GEMM route a decode of ``padded`` rows takes: the index of the first of ``routes``
    (ascending row bounds, ``LinearFit.routes``) it fits within, ``len(routes)`` above the last
    or without rows (the route the fit's intercept prices)."""
    if padded >= 1:
        for index, rows in enumerate(routes):
            if padded <= rows:
                return index
    return len(routes)


def route_columns(x: np.ndarray, routes: Sequence[int]) -> np.ndarray:
    """(rows x len(routes)) indicators: which of ``routes`` each step's decode takes."""
    taken = np.array([route_of(p, routes) for p in x[:, _PADDED_AT].tolist()], dtype=int)
    return (taken[:, None] == np.arange(len(routes))[None, :]).astype(float)


def causal_work(work: Any, new_squared: Any) -> Any:
    """Prefill attention work as the causal mask computes it: ``prefill_attn_work`` (the sum of
    new tokens x context) less half the sum of each prompt's new tokens squared, so a fresh
    prompt of n tokens counts n^2 / 2 and a few new tokens over a long cached prefix about
    their new x context (``CostOptions.causal_work``)."""
    return work - 0.5 * new_squared


@dataclass
class LinearFit:
    """time = max(floor, intercept + coef . features + roofline) (coef over ``FEATURES``, zero
    for unused ones; floor 0: a plain linear fit). The roofline: prefill attention takes the
    longer of its work over the whole GPU (``prefill_attn_work`` x its slope) and its longest
    program (``prefill_longest_s`` per key of the longest prefill context): a few new tokens
    over a long cached prefix run few programs, each reading the whole context.
    ``routes``: ascending bounds of padded decode rows where the decode's projections change
    kernel (the split-K Triton tilings up to each bound, cuBLAS above the last:
    ``CostOptions.decode_routes``); ``route_s``: each route's fixed cost beyond the intercept,
    which prices the route above the last bound."""

    intercept: float
    coef: tuple[float, ...]
    features: tuple[str, ...]
    samples: int
    floor: float = 0.0
    prefill_longest_s: float = 0.0
    routes: tuple[int, ...] = ()
    route_s: tuple[float, ...] = ()

    def route_cost(self, x: np.ndarray) -> np.ndarray:
        """Each step's route's fixed cost beyond the intercept (``routes``)."""
        if not self.routes:
            return np.zeros(len(x))
        return route_columns(x, self.routes) @ np.asarray(self.route_s, dtype=float)

    def roofline(self, x: np.ndarray) -> np.ndarray:
        """What the longest prefill program adds beyond the attention work's slope."""
        if not self.prefill_longest_s:
            return np.zeros(len(x))
        return np.maximum(self.prefill_longest_s * x[:, _LONGEST_AT]
                          - self.coef[_WORK] * x[:, _WORK], 0.0)

    def linear(self, x: np.ndarray) -> np.ndarray:
        return self.intercept + x @ np.asarray(self.coef) + self.roofline(x) + self.route_cost(x)

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(self.linear(x), max(self.floor, MIN_STEP_S))

    def linear_at(self, features: Sequence[float]) -> float:
        """``linear`` of one step in plain floats (numpy per step would cost the simulator more)."""
        out = self.intercept + sum(map(mul, self.coef, features))
        if self.prefill_longest_s:
            out += max(self.prefill_longest_s * features[_LONGEST_AT]
                       - self.coef[_WORK] * features[_WORK], 0.0)
        if self.routes:
            route = route_of(features[_PADDED_AT], self.routes)
            if route < len(self.routes):
                out += self.route_s[route]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"intercept": self.intercept, "coef": dict(zip(FEATURES, self.coef)),
                "features": list(self.features), "samples": self.samples, "floor": self.floor,
                "prefill_longest_s": self.prefill_longest_s, "routes": list(self.routes),
                "route_s": list(self.route_s)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LinearFit:
        return cls(float(data["intercept"]), tuple(float(data["coef"][n]) for n in FEATURES),
                   tuple(data["features"]), int(data["samples"]), float(data["floor"]),
                   float(data["prefill_longest_s"]), tuple(int(r) for r in data.get("routes", ())),
                   tuple(float(s) for s in data.get("route_s", ())))
