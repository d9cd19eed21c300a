"""A graph decode's time off its class fit, read on the device profile's grid
(``CostOptions.decode_grid``).

A decode's device time is not linear in its rows: at a few rows its projections run other
kernels (split-K tilings, then cuBLAS) whose time does not shrink with the rows, and the pooled
fit, whose intercept and row slope the source's full batches set, prices them 10-20% slow
(BENCHMARKS 7ag). The profile times every padded batch size over contexts of one length each
(``decode BxC``). ``DecodeGrid`` holds, at each of those points, the log of the profile's time
(scaled to the source, as its pooled rows are) over the fit's, and prices a step at the fit
times that residual, interpolated linearly in log2 of the padded rows and of the mean context
(the nearest edge beyond the grid). Where the fit passes through the profile's points the
factor is 1; the fit keeps pricing what the grid cannot see (shared prefixes, a spread of
lengths).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from replay.whatif.cost.linear import FEATURES, LinearFit

_PADDED = FEATURES.index("padded_batch_size")
_CONTEXT = FEATURES.index("decode_context_tokens")
_SEQS = FEATURES.index("decode_seqs")
# A grid level needs this many contexts to interpolate along them.
MIN_CONTEXTS = 2


def uniform_graph_decodes(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The profile's graph decodes over one context length each and private blocks: its
    ``decode BxC`` grid (not its spread or shared-prefix rows)."""
    return [row for row in rows
            if row.get("kind") == "decode" and row.get("graph_used")
            and not row.get("prefix_groups") and not row.get("cached_tokens")
            and row.get("decode_seqs", 0) > 0
            and row.get("decode_context_max", -1) * row["decode_seqs"]
            == row.get("decode_context_tokens")]


def _coordinates(step: Sequence[float]) -> tuple[float, float]:
    """log2 of a step's padded rows and of its rows' mean context."""
    rows = max(float(step[_PADDED]), 1.0)
    context = float(step[_CONTEXT]) / max(float(step[_SEQS]), 1.0)
    return math.log2(rows), math.log2(max(context, 1.0))


@dataclass(frozen=True)
class DecodeGrid:
    """Per padded-rows level (log2, ascending): the mean contexts (log2, ascending) and the log
    of the profile's time over the fit's at each."""

    levels: tuple[float, ...]
    contexts: tuple[tuple[float, ...], ...]
    residuals: tuple[tuple[float, ...], ...]

    @classmethod
    def of(cls, x: np.ndarray, time: np.ndarray, fit: LinearFit) -> DecodeGrid | None:
        """The grid of the profile's uniform graph decodes (features ``x``, device times
        ``time`` scaled to the source) against ``fit``; None with fewer than two levels."""
        predicted = fit.predict(x)
        points: dict[float, list[tuple[float, float]]] = {}
        for step, took, priced in zip(x.tolist(), time.tolist(), predicted.tolist()):
            if took > 0 and priced > 0:
                level, context = _coordinates(step)
                points.setdefault(level, []).append((context, math.log(took / priced)))
        levels, contexts, residuals = [], [], []
        for level in sorted(points):
            by_context: dict[float, list[float]] = {}
            for context, residual in points[level]:
                by_context.setdefault(context, []).append(residual)
            if len(by_context) < MIN_CONTEXTS:
                continue
            ordered = sorted(by_context)
            levels.append(level)
            contexts.append(tuple(ordered))
            residuals.append(tuple(float(np.median(by_context[c])) for c in ordered))
        if len(levels) < 2:
            return None
        return cls(tuple(levels), tuple(contexts), tuple(residuals))

    def _along(self, index: int, context: float) -> float:
        """The residual at ``context`` on level ``index`` (linear; the edge beyond it)."""
        xs, ys = self.contexts[index], self.residuals[index]
        if context <= xs[0]:
            return ys[0]
        if context >= xs[-1]:
            return ys[-1]
        j = bisect_left(xs, context)
        w = (context - xs[j - 1]) / (xs[j] - xs[j - 1])
        return ys[j - 1] + w * (ys[j] - ys[j - 1])

    def factor(self, step: Sequence[float]) -> float:
        """What the fit's price of this graph decode is multiplied by. Plain floats: the
        simulator calls it once per decode step."""
        level, context = _coordinates(step)
        levels = self.levels
        if level <= levels[0]:
            return math.exp(self._along(0, context))
        if level >= levels[-1]:
            return math.exp(self._along(len(levels) - 1, context))
        j = bisect_left(levels, level)
        if levels[j] == level:
            return math.exp(self._along(j, context))
        w = (level - levels[j - 1]) / (levels[j] - levels[j - 1])
        return math.exp((1 - w) * self._along(j - 1, context) + w * self._along(j, context))

    def factors(self, x: np.ndarray) -> np.ndarray:
        return np.array([self.factor(step) for step in x.tolist()], dtype=float)

    def to_dict(self) -> dict[str, Any]:
        return {"levels": list(self.levels), "contexts": [list(c) for c in self.contexts],
                "residuals": [list(r) for r in self.residuals]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecodeGrid:
        return cls(tuple(float(v) for v in data["levels"]),
                   tuple(tuple(float(v) for v in c) for c in data["contexts"]),
                   tuple(tuple(float(v) for v in r) for r in data["residuals"]))
