"""``--executor ray``: a grid's variants on a local Ray equal the process pool's, result by
result (metrics, per-request and per-step frames, notes), in the order of the variants.

Ray is an optional extra that ``make test`` installs (CI runs this on a local Ray of 2 CPUs).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from engine.config import Config
from replay.whatif.cost.model import CostModel
from replay.whatif.executors import variant_runner
from replay.whatif.simulate import load_source
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'replayllm[ray]')")

GRID = [(f"max_num_seqs={s} num_kvcache_blocks={b}", {"max_num_seqs": s, "num_kvcache_blocks": b})
        for s in (4, 16) for b in (4, 30, 60)]  # num_kvcache_blocks=4 cannot run


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))


def test_a_grid_on_local_ray_equals_the_process_pool(local_ray):
    requests = [Request(r.prompt[:200], min(r.max_tokens, 60)) for r in reference_workload(12)]
    events = record_workload(Config(num_kvcache_blocks=60, kvcache_block_size=32,
                                    max_num_seqs=16), requests, StepLaw(), seed=1)
    workload = load_source(events)
    cost = CostModel.fit(events)
    pooled = variant_runner("process", cost, jobs=2)(workload, GRID)
    on_ray = variant_runner("ray", cost)(workload, GRID)
    assert [r.name for r in on_ray] == [name for name, _ in GRID]
    assert sum(not r.ok for r in on_ray) == 2  # the status of a variant that cannot run, too
    for p, r in zip(pooled, on_ray):
        assert (p.name, p.status, p.notes) == (r.name, r.status, r.notes)
        assert p.metrics.keys() == r.metrics.keys()
        assert all(_same(p.metrics[k], r.metrics[k]) for k in p.metrics), p.name
        if p.ok:
            pd.testing.assert_frame_equal(p.requests, r.requests)
            pd.testing.assert_frame_equal(p.steps, r.steps)
