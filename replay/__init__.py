"""Re-driving traces: ``verify`` (replay == record) and ``simulate`` (what-if under another Config).

``from replay import verify, simulate`` gives the two functions. ``simulate`` loads on first use,
so ``replayllm verify`` never pays for the simulator's imports.
"""

from __future__ import annotations

from typing import Any

# Bound after the submodule import, so the name is the function, not the module.
from replay.verify import verify

__all__ = ["simulate", "verify"]


def __getattr__(name: str) -> Any:
    if name == "simulate":
        from replay.whatif.simulate import simulate

        return simulate
    raise AttributeError(f"module 'replay' has no attribute {name!r}")
