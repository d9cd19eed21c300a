"""What a step-time model's source covered, and warnings where a target steps outside it.

A fit is only as good as the range of steps it saw. Per class the model keeps the range of the
class's size (prompt tokens for eager prefill and mixed steps, padded tokens for graph prefills,
sequences for decode steps), whether an eager class's launch floor was identified, and whether
part of its range was seen only in the source run's warm-up window. ``source_caveats`` says
what the source cannot identify; ``target_warnings`` says where a target's steps (a
simulation's, or a recording's) lie well outside the source's range, so the prediction carries
its own caveat.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replay.whatif.cost.fit import EAGER_CLASSES, FEATURES, SIZE_FEATURE, LinearFit

# "Well outside" the source's range: below half its smallest or above twice its largest size.
OUT_OF_RANGE_FACTOR = 2.0
UNITS = {"prefill_tokens": "tokens", "num_seqs": "sequences", "padded_tokens": "padded tokens"}


def class_coverage(name: str, x: np.ndarray, steady: np.ndarray, fit: LinearFit,
                   report: dict[str, Any]) -> dict[str, Any]:
    """The range one class's fit rests on (``x``: its steps; ``steady``: those outside the
    warm-up window)."""
    s = x[:, FEATURES.index(SIZE_FEATURE[name])]
    return {
        "size": SIZE_FEATURE[name],
        "min": float(s.min()),
        "max": float(s.max()),
        "steady_max": float(s[steady].max()) if steady.any() else None,
        "steps": int(len(s)),
        "window_steps": int((~steady).sum()),
        "floor_known": fit.floor > 0 or name not in EAGER_CLASSES,
        "envelope": bool(report.get("envelope")),
    }


def _size(value: float, size: str) -> str:
    return f"{value:,.0f} {UNITS.get(size, size)}"


def source_caveats(coverage: dict[str, dict[str, Any]], window: int) -> list[str]:
    """What the source trace cannot identify, one line each."""
    lines = []
    for name, cov in coverage.items():
        size = cov["size"]
        if not cov["floor_known"] and cov["max"] < OUT_OF_RANGE_FACTOR * cov["min"]:
            # Not even a fixed cost is identified: every step had about the same size.
            lines.append(
                f"{name}: its {cov['steps']} steps all had between {cov['min']:,.0f} and "
                f"{_size(cov['max'], size)}, none on an eager launch floor: the floor is unknown "
                "and much smaller steps are predicted from the compute slope alone (may be low)"
            )
        if cov["envelope"]:
            lines.append(
                f"{name}: steps above {_size(cov['steady_max'], size)} were seen only in the "
                f"source's first {window} steps (possible warm-up): predicted from the fastest "
                "of them, an upper bound, and may be high"
            )
    return lines


def target_warnings(coverage: dict[str, dict[str, Any]], fitted: set[str], window: int,
                    x: np.ndarray, classes: np.ndarray,
                    related: dict[str, str] | None = None) -> list[str]:
    """Where the target's steps lie well outside the source's range for their class
    (``related``: class -> what a class without a fit is predicted from, in words)."""
    lines = []
    for name in sorted(set(np.unique(classes).astype(str))):
        rows = classes == name
        count = int(rows.sum())
        cov = coverage.get(name)
        if name not in fitted or cov is None:
            source = (related or {}).get(name) or "a related class's fit"
            lines.append(f"{count} {name} steps: the source has none of its own; predicted from "
                         f"{source}")
            continue
        size = cov["size"]
        s = x[rows, FEATURES.index(size)]
        small = s < cov["min"] / OUT_OF_RANGE_FACTOR
        if small.any() and not cov["floor_known"]:
            lines.append(
                f"{int(small.sum())} of {count} {name} steps much smaller than any in the source "
                f"(down to {_size(s.min(), size)}; the source's smallest had "
                f"{_size(cov['min'], size)}): eager launch floor unknown, prediction may be low"
            )
        large = s > cov["max"] * OUT_OF_RANGE_FACTOR
        if large.any():
            lines.append(
                f"{int(large.sum())} of {count} {name} steps much larger than any in the source "
                f"(up to {_size(s.max(), size)}; the source's largest had "
                f"{_size(cov['max'], size)}): cost extrapolated"
            )
        if cov["envelope"] and cov["steady_max"] is not None:
            beyond = s > cov["steady_max"]
            if beyond.any():
                lines.append(
                    f"{int(beyond.sum())} of {count} {name} steps above "
                    f"{_size(cov['steady_max'], size)}, a range the source saw only in its "
                    f"first {window} steps (possible warm-up): predicted from the fastest of "
                    "them, may be high"
                )
    return lines
