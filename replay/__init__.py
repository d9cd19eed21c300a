"""Re-driving traces: ``verify`` (replay == record) and ``simulate`` (what-if under another Config).

``from replay import verify, simulate``. Both load lazily, so ``replayllm verify`` never pays for
the simulator's imports (pandas, plotting).
"""

from __future__ import annotations

from typing import Any

__all__ = ["simulate", "verify"]


def __getattr__(name: str) -> Any:
    if name == "simulate":
        from replay.whatif.simulate import simulate

        return simulate
    if name == "verify":
        from replay.verify import verify

        return verify
    raise AttributeError(f"module 'replay' has no attribute {name!r}")
