"""What a profile point will cost, forecast from the points of the same grid already timed, so
``run_profile`` (engine/profiling.py) skips a point that would end past its budget instead of
finding out by timing it (a 32k-token prompt took 81 s on a 2-core CPU, past a 170 s budget).

The forecast is a bound, not a fit: a step's time is taken to be a fixed cost plus terms that
each grow in proportion to one of its sizes (``point_sizes``: rows, prompt tokens, prompt
attention work, decode rows, decode context, longest decode context). Then a point costs at
most a timed point's cost times the largest ratio of its sizes to that point's (at least 1),
and the forecast is the least of these bounds over the timed points of its class. A single
ratio such as tokens alone misses the quadratic attention of long prompts (the old estimate:
the last point of the kind scaled by tokens, which priced 32768 tokens in one prompt from 8192
in 16 at x4, not x64). Where sizes grow by less than a fixed cost weighs (a GPU decode of 8 rows
against 1), the bound overshoots; a GPU profile's budget is far from binding (the committed
H100/H200 profiles ran 20-28 s of 170), so it times the same points as before. Torch-free.
"""

from __future__ import annotations

import math

from engine.profile_point import ProfilePoint

Sizes = tuple[int, ...]


def point_sizes(point: ProfilePoint) -> Sizes:
    """(rows, prompt tokens, prompt attention work: new x context summed, decode rows, decode
    context tokens, longest decode context): the sizes ``CostForecast`` scales by."""
    contexts = point.decode_contexts
    return (point.num_seqs, sum(n for n, _ in point.prompts),
            sum(n * (n + c) for n, c in point.prompts), len(contexts), sum(contexts),
            max(contexts, default=0))


def size_ratio(sizes: Sizes, timed: Sizes) -> float:
    """The largest ratio of ``sizes`` to ``timed``'s, at least 1; infinite where ``sizes`` has
    work of a sort ``timed`` had none of (nothing to scale it from)."""
    ratio = 1.0
    for size, base in zip(sizes, timed):
        if size > base:
            ratio = max(ratio, size / base if base else math.inf)
    return ratio


class CostForecast:
    """The seconds per run (an untimed warm-up or a timed repeat) of each point timed so far,
    by class (kind, and eager or not: an eager step launches every kernel itself), and the
    forecast of a point's from them."""

    def __init__(self) -> None:
        self._timed: dict[tuple[str, bool], list[tuple[Sizes, float]]] = {}

    def record(self, point: ProfilePoint, seconds_per_run: float) -> None:
        self._timed.setdefault((point.kind, point.eager), []).append(
            (point_sizes(point), seconds_per_run))

    def seconds_per_run(self, point: ProfilePoint) -> float | None:
        """The forecast seconds of one run of ``point``; None where nothing of its class was
        timed, or nothing timed had work of each sort it has (no forecast: the first point of
        a kind)."""
        sizes = point_sizes(point)
        bound = min((seconds * size_ratio(sizes, timed)
                     for timed, seconds in self._timed.get((point.kind, point.eager), ())),
                    default=math.inf)
        return bound if math.isfinite(bound) else None
