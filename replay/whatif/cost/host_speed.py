"""The host's speed as device information: a target machine's host work priced from its
start-up calibration.

The model prices the engine's host work (each class's ``host_s``; an eager step's launches,
which bound its interval through ``interval``'s max; the engine's work around a sequential
step, in its offset; the live loop's adds of requests) as the source's host did it. Another
machine's CPU (or the same one, loaded) does that work at another speed while the GPU times a
CUDA graph's replay the same. Every engine start times the same fixed steps before any traffic
(``engine.calibration``, the trace header's ``calibration``). An eager row's host work (its
call's wall time less its wait for the device) is the CPU launching a whole forward, kernel by
kernel: a measure of the host, taken like a device profile. The median over the eager shapes
both calibrations timed of target over source is the target host's speed relative to the
source's (``host_speed``); ``CostModel.on_host`` prices a model's host terms on that host
(``host_terms_scaled``). Nothing of the
target's own traffic enters it. (A graph row's host work, a fraction of a millisecond of
staging, moves less with the host than the engine's own work does: not used.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.errors import ReplayLLMError
from replay.whatif.cost.arrivals import AddCost
from replay.whatif.cost.linear import LinearFit
from replay.whatif.cost.overlap import OverlapModel

# A calibration row's shape: what both calibrations must have timed alike to compare hosts.
SHAPE = ("kind", "graph_used", "num_seqs", "prefill_tokens", "decode_seqs",
         "decode_context_tokens")
MIN_SHAPES = 3  # fewer eager shapes timed by both calibrations: the host cannot be measured


class HostSpeedError(ReplayLLMError):
    """A target host's speed cannot be measured (no calibration, or too little in common)."""


def shape_key(row: Mapping[str, Any]) -> str:
    return "/".join(str(row[name]) for name in SHAPE)


def calibration_hosts(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each eager shape's host work (seconds) in a header's calibration rows (those that
    recorded their wait for the device)."""
    return {shape_key(row): float(row["interval_s"]) - float(row["wait_s"]) for row in rows
            if not row["graph_used"] and row.get("wait_s") is not None
            and float(row["interval_s"]) > float(row["wait_s"])}


@dataclass(frozen=True)
class HostSpeed:
    """A target host's host work over the source host's (``ratio``), measured on ``shapes``
    eager calibration shapes both timed; ``name``: whose calibration."""

    ratio: float
    shapes: int
    name: str = ""

    def words(self) -> str:
        return (f"host work priced x{self.ratio:.2f} of the source's: {self.name}'s start-up "
                f"calibration (median over {self.shapes} eager shapes)")


def host_speed(source: Mapping[str, float], rows: Sequence[Mapping[str, Any]],
               name: str = "the target") -> HostSpeed:
    """The target's host speed from its calibration ``rows`` against the source's
    (``calibration_hosts``): the median ratio over the eager shapes both timed."""
    target = calibration_hosts(rows)
    ratios = [target[key] / source[key] for key in target if source.get(key, 0.0) > 0]
    if len(ratios) < MIN_SHAPES:
        raise HostSpeedError(f"{name}: its start-up calibration and the source's have "
                             f"{len(ratios)} eager shapes in common (at least {MIN_SHAPES} "
                             "are needed to measure its host)")
    return HostSpeed(float(np.median(ratios)), len(ratios), name)


def _scaled(fit: LinearFit, ratio: float) -> LinearFit:
    return replace(fit, intercept=fit.intercept * ratio,
                   coef=tuple(c * ratio for c in fit.coef), floor=fit.floor * ratio,
                   prefill_longest_s=fit.prefill_longest_s * ratio)


def host_terms_scaled(overlap: OverlapModel, add: AddCost, k: float
                      ) -> tuple[OverlapModel, AddCost]:
    """Every host term times ``k``: the host fits and one-off host costs per class, the
    sequential steps' offsets (the engine's work around a step and its sync), the cost of
    adding a request (``CostModel.on_host``)."""
    offsets = {**overlap.offsets, "sequential": {
        c: s * k for c, s in overlap.offsets.get("sequential", {}).items()}}
    overlap = replace(overlap, host={c: _scaled(f, k) for c, f in overlap.host.items()},
                      host_warmup_s={c: s * k for c, s in overlap.host_warmup_s.items()},
                      offsets=offsets, sync_s=overlap.sync_s * k)
    return overlap, AddCost(add.per_request_s * k, add.per_token_s * k, add.samples)
