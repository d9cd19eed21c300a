"""Re-driving traces: ``verify`` (replay == record) and ``simulate`` (what-if under another Config).

``from replay import verify, simulate``.
"""

from replay.simulate import simulate
from replay.verify import verify

__all__ = ["simulate", "verify"]
