"""A graph decode's fixed cost per GEMM route (``CostOptions.decode_routes``,
``LinearFit.routes``): the engine runs a decode's o_proj and down projections through split-K
Triton tilings up to 16, 64 and 128 padded rows and cuBLAS above, so a step's fixed cost
changes with its CUDA graph's size; one intercept for every size prices the few-row steps at
the many large steps' level (BENCHMARKS 7u, 7y, 7z).

What these tests prove:
- the routes are the split-K buckets where the source's engine ran split-K GEMMs
  (``Config.split_k_gemm``), none where it did not, and match the engine's tiling table;
- fitted, each route's fixed cost is recovered beside the slopes, a step priced by its route
  (in the fit's arrays and per step alike), and the few-row steps are no longer priced at the
  large steps' level; a route too few rows take gets no cost of its own;
- a fit with routes survives a save and load;
- it is opt-in: the default options fit one intercept for every size.
"""

from __future__ import annotations

import numpy as np
import pytest

from replay.whatif.cost import fit as fitting
from replay.whatif.cost.features import FEATURES, Steps
from replay.whatif.cost.linear import LinearFit, route_of
from replay.whatif.cost.lstsq import fit_linear
from replay.whatif.cost.options import SPLIT_K_ROUTES, CostOptions, decode_routes

AT = FEATURES.index
ROUTES = (16, 64, 128)
# The law of the synthetic decodes: a base, per padded row, per KV token, and each route's own.
BASE_S, PER_ROW_S, PER_KV_S = 1.40e-3, 1.5e-6, 2e-8
ROUTE_S = (-0.30e-3, -0.20e-3, -0.10e-3)


def _decodes(sizes: list[int], per_size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    rows = [(size, int(rng.integers(500, 3000)) * size) for size in sizes for _ in range(per_size)]
    x = np.zeros((len(rows), len(FEATURES)))
    for i, (size, kv) in enumerate(rows):
        x[i, AT("num_seqs")] = x[i, AT("decode_seqs")] = size
        x[i, AT("padded_batch_size")] = size
        x[i, AT("decode_kv_tokens")] = x[i, AT("decode_context_tokens")] = kv
    route = np.array([route_of(s, ROUTES) for s in x[:, AT("padded_batch_size")]])
    extra = np.array([*ROUTE_S, 0.0])[route]
    y = BASE_S + PER_ROW_S * x[:, AT("padded_batch_size")] + PER_KV_S * x[:, AT(
        "decode_kv_tokens")] + extra
    return x, y


SIZES = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512]


def test_the_routes_are_the_split_k_buckets_of_a_split_k_engine() -> None:
    assert decode_routes({"config": {"split_k_gemm": True}}) == SPLIT_K_ROUTES == ROUTES
    assert decode_routes({"config": {"split_k_gemm": False}}) == ()
    assert decode_routes({}) == ()  # a trace before the field: cuBLAS at every size
    decode_gemm = pytest.importorskip("engine.model.layers.decode_gemm")
    assert tuple(decode_gemm.split_k_batches()) == SPLIT_K_ROUTES
    assert [route_of(p, ROUTES) for p in (0, 1, 16, 17, 64, 65, 128, 129, 512)] == [
        3, 0, 0, 1, 1, 2, 2, 3, 3]


def test_each_route_s_fixed_cost_is_fitted_beside_the_slopes() -> None:
    x, y = _decodes(SIZES)
    fit = fit_linear(x, y, ("padded_batch_size", "decode_kv_tokens"), routes=ROUTES)
    assert fit.routes == ROUTES
    assert fit.intercept == pytest.approx(BASE_S, rel=1e-6)
    assert fit.route_s == pytest.approx(ROUTE_S, rel=1e-6)
    assert fit.predict(x) == pytest.approx(y, rel=1e-9)
    assert [fit.linear_at(row) for row in x.tolist()] == pytest.approx(y.tolist(), rel=1e-9)
    # One intercept for every size prices a one-row step at the large steps' level.
    plain = fit_linear(x, y, ("padded_batch_size", "decode_kv_tokens"))
    one_row = x[:, AT("padded_batch_size")] == 1
    assert (plain.predict(x[one_row]) - y[one_row]).mean() > 0.04e-3  # +4%
    # A route too few rows take (one 48-row step) gets no cost of its own.
    few = x[:, AT("padded_batch_size")] != 32
    few &= ~((x[:, AT("padded_batch_size")] == 48) & (np.arange(len(x)) % 8 > 0))
    few &= ~((x[:, AT("padded_batch_size")] == 64) | (x[:, AT("padded_batch_size")] == 96)
             | (x[:, AT("padded_batch_size")] == 128))
    sparse = fit_linear(x[few], y[few], ("padded_batch_size", "decode_kv_tokens"), routes=ROUTES)
    assert sparse.route_s[0] < -0.2e-3
    assert sparse.route_s[1:] == (0.0, 0.0)


def test_only_the_graph_decodes_are_routed_and_a_saved_fit_keeps_them() -> None:
    x, y = _decodes(SIZES)
    n = len(y)
    no = np.zeros(n, dtype=bool)
    steps = Steps(x=x, classes=np.array(["decode_graph"] * n), time=y, host=np.full(n, np.nan),
                  interval=y, overlapped=no, is_calibration=no, window=no.copy())
    fits, _ = fitting.fit_all(steps, routes=ROUTES)
    assert fits["decode_graph"].route_s == pytest.approx(ROUTE_S, rel=1e-3)
    assert fits["pooled"].routes == ()
    plain, _ = fitting.fit_all(steps)
    assert plain["decode_graph"].routes == ()
    saved = LinearFit.from_dict(fits["decode_graph"].to_dict())
    assert saved == fits["decode_graph"]


def test_it_is_opt_in() -> None:
    assert CostOptions().decode_routes is False
    assert CostOptions.parse(["decode_routes=on"]).decode_routes is True
