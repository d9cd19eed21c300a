"""Variants on a Ray cluster (``RAY_ADDRESS``), or on a local Ray started here when none is set.

The workload and the step-time model go to Ray's object store once; each variant is one task
running ``run_variant`` on them, exactly as a process-pool worker does, so the results equal
the process pool's. Ray is optional: ``pip install 'replayllm[ray]'``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from engine.errors import ReplayLLMError
from replay.whatif.cost.model import CostModel
from replay.whatif.simulate import SimResult, SimWorkload, run_variant


class ExecutorUnavailable(ReplayLLMError):
    """The executor asked for cannot run here (Ray not installed)."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ExecutorUnavailable("--executor ray needs Ray: pip install 'replayllm[ray]'"
                                  ) from None
    if not ray.is_initialized():
        # RAY_ADDRESS (read by ray.init itself) joins a cluster; without it, a local Ray.
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=False,
                 include_dashboard=False)
    return ray


def _run(workload: SimWorkload, cost: CostModel | None, name: str,
         overrides: dict[str, Any]) -> SimResult:
    return run_variant(workload, overrides, cost, name, keep_events=False)


def simulate_many_ray(
    workload: SimWorkload,
    variants: list[tuple[str, dict[str, Any]]],
    cost: CostModel | None,
    progress: Callable[[], None] | None = None,
) -> list[SimResult]:
    """Run ``(name, overrides)`` variants as Ray tasks; results in the order of ``variants``."""
    ray = _ray()
    task = ray.remote(num_cpus=1)(_run)
    # The recording itself is not needed to simulate (only to fit a model, done already).
    shared = ray.put(dataclasses.replace(workload, recorded=None))
    shared_cost = ray.put(cost)
    refs = [task.remote(shared, shared_cost, name, overrides) for name, overrides in variants]
    index = {ref: i for i, ref in enumerate(refs)}
    out: list[SimResult | None] = [None] * len(refs)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            out[index[ref]] = ray.get(ref)
            if progress is not None:
                progress()
    return [r for r in out if r is not None]
