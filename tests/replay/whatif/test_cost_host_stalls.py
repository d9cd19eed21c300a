"""Host stalls (``replay.whatif.cost.overlap.host_stall_rate``, ``OverlapModel.stall_rate``): the
engine's thread now and then stalls (recorder writes, the collector); an eager step's kernels
wait for its launches, so it pays the stalls in device time, a CUDA-graph step does not.

What these tests prove:
- the rate is the source's own: its most frequent class's mean host time over the median,
  less one (a run without a tail has none; a run too short to tell has none);
- the model charges it on an eager step's device time, ``rate x`` its host time, and on no
  CUDA-graph step; switched off (``host_stalls=off``) it charges nothing;
- it is opt-in (``host_stalls=on``): the default model charges nothing; it travels with a
  saved model.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.config import Config
from replay.whatif.cost.features import FEATURES, Steps
from replay.whatif.cost.model import CostModel
from replay.whatif.cost.options import CostOptions
from replay.whatif.cost.overlap import host_stall_rate
from replay.whatif.synthetic import HostLaw, StepLaw, record_workload
from replay.workloads.builtin import reference_workload


def _run(host: np.ndarray, classes: list[str]) -> Steps:
    n = len(host)
    no = np.zeros(n, dtype=bool)
    return Steps(x=np.zeros((n, len(FEATURES))), classes=np.array(classes), time=np.ones(n),
                 host=host, interval=np.ones(n), overlapped=no, is_calibration=no,
                 window=no.copy())


def test_the_rate_is_the_mean_host_time_over_the_median() -> None:
    host = np.full(200, 1e-3)
    host[::20] = 3e-3  # one step in twenty stalls 2 ms
    rate = host_stall_rate(_run(host, ["decode_graph"] * 200))
    assert rate == pytest.approx(0.10, rel=1e-9)
    assert host_stall_rate(_run(np.full(200, 1e-3), ["decode_graph"] * 200)) == pytest.approx(
        0.0, abs=1e-12)
    assert host_stall_rate(_run(host[:4], ["decode_graph"] * 4)) == 0.0  # too few to tell
    # Measured on the most frequent class only.
    mixed = _run(np.concatenate([host, np.full(20, 9e-3)]), ["decode_graph"] * 200 + [
        "prefill"] * 20)
    assert host_stall_rate(mixed) == pytest.approx(0.10, rel=1e-9)


@pytest.fixture(scope="module")
def model() -> CostModel:
    trace = record_workload(Config(num_kvcache_blocks=2000, max_num_seqs=64),
                            reference_workload()[:48], StepLaw(noise=0.0, flush_every=0),
                            host=HostLaw(launch_s=4e-3))
    return CostModel.fit(trace, options=CostOptions(host_stalls=True))


def _with_rate(model: CostModel, rate: float) -> CostModel:
    out = replace(model, overlap=replace(model.overlap, stall_rate=rate))
    out._times.clear()
    out._prior_times.clear()
    return out


def test_an_eager_step_pays_the_stalls_on_its_device_time_a_graph_step_does_not(model) -> None:
    step = [0.0] * len(FEATURES)
    step[FEATURES.index("num_seqs")] = 4
    step[FEATURES.index("prefill_tokens")] = step[FEATURES.index("padded_tokens")] = 2000
    decode = [0.0] * len(FEATURES)
    for name in ("num_seqs", "decode_seqs", "padded_batch_size"):
        decode[FEATURES.index(name)] = 32
    decode[FEATURES.index("decode_context_tokens")] = decode[FEATURES.index(
        "decode_kv_tokens")] = 32 * 500
    calm, stalled = _with_rate(model, 0.0), _with_rate(model, 0.2)
    eager, eager_stalled = calm.predict(step, "prefill"), stalled.predict(step, "prefill")
    assert eager_stalled.device_s == pytest.approx(eager.device_s + 0.2 * eager.host_s)
    assert eager_stalled.host_s == eager.host_s
    for cls in ("decode_graph", "prefill_graph"):
        row = decode if cls == "decode_graph" else step
        assert stalled.predict(row, cls, True) == calm.predict(row, cls, True)


def test_it_is_opt_in_and_travels(model, tmp_path) -> None:
    trace = record_workload(Config(num_kvcache_blocks=2000, max_num_seqs=64),
                            reference_workload()[:48], StepLaw(noise=0.0, flush_every=0),
                            host=HostLaw(launch_s=4e-3, noise=0.3), seed=3)
    on = CostModel.fit(trace, options=CostOptions(host_stalls=True))
    off = CostModel.fit(trace)
    assert on.overlap is not None and off.overlap is not None
    assert on.overlap.stall_rate > 0 and off.overlap.stall_rate == 0.0
    on.save(tmp_path / "m.json")
    assert CostModel.load(tmp_path / "m.json").overlap.stall_rate == on.overlap.stall_rate
