"""A target host's speed from its start-up calibration (``replay.whatif.cost.host_speed``).

What these tests prove:
- the speed is the median over the eager calibration shapes both hosts timed of target over
  source host work (a graph shape does not count); too few shapes in common is an error;
- ``CostModel.on_host`` multiplies every host term (host time of every class, the sequential
  offsets, the cost of adding a request) by it and leaves device time alone; on the source's
  own host it changes no prediction; the priced host travels with a saved model, and a priced model
  priced on another host is rescaled from its host, not compounded;
- a synthetic run on a host twice as slow is predicted from a source on the fast host much
  better with the slow host's calibration than without;
- the source's eager calibration shapes are read from its header at fit time;
- a profile taken on another host than the source's says so: the ratio of its eager rows' host
  work to the source calibration's is measured on the shapes both timed and warned of beyond
  ``HOST_WARNING_RATIO`` (committed H200 recordings: a host 1.56x slower than the profile's
  warns, one within 1.16x does not), and it travels with a saved model.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from engine.config import Config
from replay.metrics import compute, relative_error
from replay.whatif.cost.arrivals import AddCost
from replay.whatif.cost.features import FEATURES, feature_matrix
from replay.whatif.cost.host_speed import (
    HostSpeedError,
    calibration_hosts,
    host_speed,
)
from replay.whatif.cost.model import CostModel
from replay.whatif.simulate import load_source, run_variant
from replay.whatif.synthetic import HostLaw, StepLaw, record_workload
from replay.workloads.builtin import reference_workload

CONFIG = Config(num_kvcache_blocks=2000, max_num_seqs=64)
FAST = HostLaw(base_s=1.2e-3, per_seq_s=1.5e-5, sync_s=1.5e-4, launch_s=8e-3)
SLOW = HostLaw(base_s=2.4e-3, per_seq_s=3e-5, sync_s=3e-4, launch_s=16e-3)


def _row(tokens: int, host_s: float, graph: bool = False) -> dict:
    return {"kind": "prefill", "graph_used": graph, "num_seqs": 1, "prefill_tokens": tokens,
            "decode_seqs": 0, "decode_context_tokens": 0, "interval_s": host_s + 1e-3,
            "wait_s": 1e-3}


def _calibration(law: HostLaw) -> list[dict]:
    """Eager prefill rows of one prompt as ``law``'s host would time them, and a graph row."""
    host = law.base_s + law.per_seq_s + law.launch_s
    return [_row(t, host) for t in (1, 16, 128, 512)] + [_row(16, 7 * law.base_s, graph=True)]


def test_the_speed_is_the_median_ratio_over_the_eager_shapes_both_timed() -> None:
    source = calibration_hosts([_row(t, 0.01) for t in (1, 16, 128, 512)]
                               + [_row(16, 0.001, graph=True)])
    assert len(source) == 4  # the graph row is not a measure of the host
    target = [_row(1, 0.02), _row(16, 0.03), _row(128, 0.025), _row(512, 0.5),
              _row(9999, 0.1), _row(16, 0.009, graph=True)]
    speed = host_speed(source, target, "t")
    assert speed.shapes == 4 and speed.ratio == pytest.approx(2.75)
    with pytest.raises(HostSpeedError, match="2 eager shapes in common"):
        host_speed(source, target[:2], "t")


@pytest.fixture(scope="module")
def runs() -> dict:
    requests = reference_workload()[:48]
    law = StepLaw(noise=0.0, flush_every=0)
    return {name: record_workload(CONFIG, requests, law, host=host)
            for name, host in (("fast", FAST), ("slow", SLOW))}


@pytest.fixture(scope="module")
def model(runs) -> CostModel:
    fitted = CostModel.fit(runs["fast"])
    return replace(fitted, host_calibration=calibration_hosts(_calibration(FAST)),
                   add=AddCost(1e-5, 1e-8, 100))


def _steps() -> dict[str, list[float]]:
    prefill = [0.0] * len(FEATURES)
    for name, value in (("num_seqs", 4), ("prefill_tokens", 2000), ("padded_tokens", 2000),
                        ("prefill_attn_work", 500_000)):
        prefill[FEATURES.index(name)] = value
    decode = [0.0] * len(FEATURES)
    for name in ("num_seqs", "decode_seqs", "padded_batch_size"):
        decode[FEATURES.index(name)] = 32
    decode[FEATURES.index("decode_context_tokens")] = decode[FEATURES.index(
        "decode_kv_tokens")] = 32 * 500
    return {"prefill": prefill, "decode_graph": decode}


def test_every_host_term_scales_and_device_time_does_not(model) -> None:
    slow = model.on_host(_calibration(SLOW), "slow")
    assert slow.host is not None and slow.host.ratio == pytest.approx(2.0)
    for cls, step in _steps().items():
        for overlapped in (False, True):
            fast_t = model.predict(step, cls, overlapped)
            slow_t = slow.predict(step, cls, overlapped)
            assert slow_t.device_s == fast_t.device_s
            assert slow_t.host_s == pytest.approx(2 * fast_t.host_s)
    assert model.overlap is not None and slow.overlap is not None
    for cls, offset in model.overlap.offsets["sequential"].items():
        assert slow.overlap.offset("sequential", cls) == pytest.approx(2 * offset)
    assert slow.overlap.offsets["overlapped"] == model.overlap.offsets["overlapped"]
    assert slow.add.seconds(1000) == pytest.approx(2 * model.add.seconds(1000))
    same = model.on_host(_calibration(FAST), "fast")
    assert same.host is not None and same.host.ratio == 1.0
    for cls, step in _steps().items():
        assert same.predict(step, cls) == model.predict(step, cls)


def test_a_slow_host_is_predicted_from_its_calibration(runs, model) -> None:
    """Same device law, host work doubled: the fast host's model predicts the slow run's TTFT
    and makespan far better with the slow host's calibration than without."""
    measured = compute(runs["slow"]).summary
    workload = load_source(runs["slow"])
    errors = {}
    for name, priced in (("plain", model), ("on host", model.on_host(_calibration(SLOW)))):
        result = run_variant(workload, {}, replace(priced, add=AddCost()), name)
        errors[name] = {m: abs(relative_error(result.metrics[m], measured[m]))
                        for m in ("ttft_mean_s", "makespan_s")}
    assert errors["plain"]["ttft_mean_s"] > 0.05  # the slow host matters to the metric
    assert errors["on host"]["ttft_mean_s"] < errors["plain"]["ttft_mean_s"] / 4
    assert errors["on host"]["makespan_s"] < errors["plain"]["makespan_s"]


def test_the_priced_host_travels_and_a_source_without_calibration_is_refused(
        runs, model, tmp_path: Path) -> None:
    slow = model.on_host(_calibration(SLOW), "slow")
    slow.save(tmp_path / "m.json")
    loaded = CostModel.load(tmp_path / "m.json")
    assert loaded.host == slow.host and loaded.host_calibration == slow.host_calibration
    step = _steps()["prefill"]
    assert loaded.predict(step, "prefill") == slow.predict(step, "prefill")
    # Priced on a host once more, a priced model is rescaled from its host, not compounded.
    again = loaded.on_host(_calibration(SLOW), "slow")
    assert again.predict(step, "prefill").host_s == pytest.approx(
        slow.predict(step, "prefill").host_s)
    back = slow.on_host(_calibration(FAST), "fast")
    assert back.predict(step, "prefill").host_s == pytest.approx(
        model.predict(step, "prefill").host_s)
    with pytest.raises(HostSpeedError, match="no host times or eager"):
        CostModel.fit(runs["fast"]).on_host(_calibration(SLOW))


def test_the_source_calibration_is_read_at_fit_time() -> None:
    from replay.recorded import from_trace
    from tracing.reader import read_trace

    events = from_trace(read_trace("traces/h200-reference-s4"))
    model = CostModel.fit(events)
    assert model.host_calibration == calibration_hosts(events.header["calibration"])
    assert model.host_calibration and all("/False/" in key for key in model.host_calibration)
    assert model.on_host(events.header["calibration"]).host.ratio == 1.0


def test_a_profile_of_another_host_is_measured_and_warned_of(tmp_path: Path) -> None:
    from replay.recorded import from_trace
    from replay.whatif.cost.profile import HOST_WARNING_RATIO
    from tracing.reader import read_trace

    profile = "traces/profiles/h200-qwen3-0.6b-s13-default-p1.profile.json"
    slow = from_trace(read_trace("traces/matrix-s13b/reference-default"))
    model = CostModel.fit(slow, profile=profile)
    ratio = model.prior.host_ratio
    assert model.prior.host_shapes >= 3 and ratio < 1 / HOST_WARNING_RATIO
    x, classes = feature_matrix(slow)
    assert any(f"x{ratio:.2f} of the source's" in line for line in model.prior.warnings(x, classes))
    model.save(tmp_path / "m.json")
    assert CostModel.load(tmp_path / "m.json").prior.host_ratio == ratio
    alike = from_trace(read_trace("traces/h200-reference-s4"))
    near = CostModel.fit(alike, profile="traces/profiles/h200-qwen3-0.6b.profile.json")
    assert 1 / HOST_WARNING_RATIO <= near.prior.host_ratio <= HOST_WARNING_RATIO
    x, classes = feature_matrix(alike)
    assert not any("the profile's host" in line for line in near.prior.warnings(x, classes))
