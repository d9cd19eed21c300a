"""Where the variants of a grid or a search run: the local process pool or a Ray cluster.

Each variant is one ``run_variant`` call on the same workload and step-time model, and a run
depends on nothing but those, so the results are the same whichever executor runs them; both
return them in the order of the variants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.errors import ReplayLLMError
from replay.whatif.cost.model import CostModel
from replay.whatif.simulate import SimResult, SimWorkload, simulate_many

EXECUTORS = ("process", "ray")


def variant_runner(executor: str, cost: CostModel | None, jobs: int | None = None,
                   progress: Callable[[], None] | None = None
                   ) -> Callable[[SimWorkload, list[tuple[str, dict[str, Any]]]], list[SimResult]]:
    """A function running ``(name, overrides)`` variants of a workload on ``executor``."""
    if executor == "process":
        def run(workload: SimWorkload, variants: list[tuple[str, dict[str, Any]]]
                ) -> list[SimResult]:
            return simulate_many(workload, variants, cost, jobs, progress=progress)

        return run
    if executor == "ray":
        from replay.whatif.ray_executor import simulate_many_ray

        def run_ray(workload: SimWorkload, variants: list[tuple[str, dict[str, Any]]]
                    ) -> list[SimResult]:
            return simulate_many_ray(workload, variants, cost, progress=progress)

        return run_ray
    raise ReplayLLMError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
