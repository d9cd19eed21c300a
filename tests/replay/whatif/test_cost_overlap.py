"""Overlap-aware step times (trace schema 2): device and host time fitted apart, combined per step
by whether it was launched overlapped.

What these tests prove, on synthetic recordings whose times follow a known law (device time:
``CausalLaw``, linear in the batch, its attention work counted as the default model counts it;
host time: ``HostLaw``, c + d x sequences; a step's interval by the overlap rule, with a sync
latency per sequential step and, for an eager step, a launch time its device and host work
share):
- the law is recovered: device and host coefficients and the per-class offsets; the held-out
  error of the source's own intervals is ~0;
- a mostly sequential run is predicted from a mostly overlapped one, and the reverse, makespan
  within 1% (with noise too), where an interval-mode model of the same source misses by far;
- an eager step's launch time is counted once: measured where the source has sequential steps of
  its class, derived from its launch floor where it has none (a chunked target's mixed steps);
- the simulated executor charges max(device, host) to a batch flagged overlapped, device + host
  to any other, and reports them as the engine records them;
- an overlapped step is priced at its mean host time unless ``host_spread`` (opt-in) prices it
  over the source's spread of host times about their fit;
- a version-1 trace (host_s NaN) or one whose host time was never measured (zeros) stays in
  interval mode; save/load keeps the mode; describe names the mode.

The launch decisions are the synthetic rule's (``HostLaw.overlaps``) in both the recording and
the simulation (``RuleSimExecutor``), so these tests do not depend on EngineCore's; the last test
takes EngineCore's own decisions, and is skipped while the engine makes none.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest
from _cost_helpers import CausalLaw, predicted_intervals

import replay.whatif.simulate as simulate_module
from engine.batch import ScheduledBatch
from engine.config import Config
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from replay.metrics import compute
from replay.recorded import RecordedEvents
from replay.whatif.cost.features import (
    FEATURES,
    MIN_STEP_S,
    Steps,
    feature_matrix,
    step_intervals,
)
from replay.whatif.cost.fit import LinearFit
from replay.whatif.cost.model import CostModel, OverlapModel
from replay.whatif.cost.options import CostOptions
from replay.whatif.cost.overlap import SPREAD_QUANTILES
from replay.whatif.sim_executor import SimClock, SimExecutor
from replay.whatif.simulate import SimResult, simulate
from replay.whatif.synthetic import HostLaw, StepLaw, record_workload
from replay.workloads.request import Request

LAW = CausalLaw(noise=0.0, flush_every=0)
HOST = HostLaw()
OVERLAPPING = Config(num_kvcache_blocks=600)  # async scheduling on: most decodes overlap
SEQUENTIAL = Config(num_kvcache_blocks=150, max_num_seqs=24, async_scheduling=False)


def staggered_requests(count: int = 120, lo: int = 20, hi: int = 600, seed: int = 0
                       ) -> list[Request]:
    """Requests arriving one by one: prefills (sequential steps) between runs of decodes."""
    rng = np.random.default_rng(seed)
    return [Request(rng.integers(0, 9000, size=int(rng.integers(lo, hi))).tolist(),
                    int(rng.integers(20, 200)), arrival_s=0.03 * i) for i in range(count)]


REQUESTS = staggered_requests()


class RuleSimExecutor(SimExecutor):
    """The simulated executor, with batches flagged by the synthetic launch rule."""

    def __init__(self, *args, overlap: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._overlap = overlap
        self._previous: ScheduledBatch | None = None

    def execute(self, batch: ScheduledBatch):
        batch.overlapped = HostLaw.overlaps(self._previous, batch, self._overlap)
        self._previous = batch
        return super().execute(batch)


def overrides_between(a: Config, b: Config) -> dict:
    return {k: v for k, v in b.to_dict().items() if a.to_dict()[k] != v}


def predict(monkeypatch, source: RecordedEvents, source_config: Config, target: Config,
            timing=None) -> SimResult:
    monkeypatch.setattr(simulate_module, "SimExecutor",
                        partial(RuleSimExecutor, overlap=target.async_scheduling))
    result = simulate(source, overrides_between(source_config, target),
                      timing=timing if timing is not None else "auto")
    assert result.ok, result.status
    return result


def overlapped_fraction(events: RecordedEvents) -> float:
    return float(np.mean(events.tables["model_step"]["overlapped"]))


@pytest.fixture(scope="module")
def recordings() -> dict[str, RecordedEvents]:
    return {
        "overlapping": record_workload(OVERLAPPING, REQUESTS, LAW, seed=1, host=HOST),
        "sequential": record_workload(SEQUENTIAL, REQUESTS, LAW, seed=2, host=HOST),
    }


def test_the_law_is_recovered_in_overlap_mode(recordings) -> None:
    trace = recordings["overlapping"]
    assert overlapped_fraction(trace) > 0.75
    model = CostModel.fit(trace, source="A")
    assert model.mode == "overlap"
    ctx = model.fits["decode_graph"].coef[FEATURES.index("decode_kv_tokens")]
    assert ctx == pytest.approx(LAW.per_context_token_s, rel=1e-6)
    host = model.overlap.host["decode_graph"]
    assert host.intercept == pytest.approx(HOST.base_s, rel=1e-6)
    assert host.coef[FEATURES.index("num_seqs")] == pytest.approx(HOST.per_seq_s, rel=1e-6)
    for name in ("prefill", "decode_graph"):
        assert model.overlap.offset("sequential", name) == pytest.approx(HOST.sync_s, rel=1e-6)
    assert model.overlap.offset("overlapped", "decode_graph") == pytest.approx(0.0, abs=1e-9)
    interval = model.overlap.heldout["interval"]
    assert interval["all"]["mape_pct"] < 0.01 and interval["overlapped"]["n"] > 100
    assert interval["sequential"]["mape_pct"] < 0.01
    x, classes = feature_matrix(trace, causal=model.causal_work)
    flags = np.asarray(trace.tables["model_step"]["overlapped"])
    steady = np.arange(len(classes)) >= model.window_steps
    assert predicted_intervals(model, x, classes, flags)[steady] == pytest.approx(
        step_intervals(trace)[steady], rel=1e-6)
    text = model.describe()
    assert "overlap mode" in text and "host time per step" in text
    assert "interval held-out" in text


DIRECTIONS = [("overlapping", "sequential"), ("sequential", "overlapping")]
CONFIGS = {"overlapping": OVERLAPPING, "sequential": SEQUENTIAL}


@pytest.mark.parametrize("source,target", DIRECTIONS, ids=[f"{t} from {s}" for s, t in DIRECTIONS])
def test_a_run_overlapping_another_fraction_of_steps_is_predicted(
    recordings, monkeypatch, source: str, target: str
) -> None:
    measured = compute(recordings[target]).summary
    result = predict(monkeypatch, recordings[source], CONFIGS[source], CONFIGS[target])
    assert result.metrics["steps"] == measured["steps"]
    for metric in ("makespan_s", "throughput_tok_s", "ttft_mean_s", "tpot_p50_s"):
        assert result.metrics[metric] == pytest.approx(measured[metric], rel=1e-6), metric
    # The same source without its host times (a version-1 trace): no way to tell what overlap
    # saved, and a prediction that misses.
    blind = _without_host_times(recordings[source])
    interval_model = CostModel.fit(blind)
    assert interval_model.mode == "interval"
    missed = predict(monkeypatch, blind, CONFIGS[source], CONFIGS[target], interval_model)
    assert abs(missed.metrics["makespan_s"] / measured["makespan_s"] - 1) > 0.04


def _without_host_times(events: RecordedEvents) -> RecordedEvents:
    tables = {kind: dict(cols) for kind, cols in events.tables.items()}
    ms = tables["model_step"]
    ms["host_s"] = np.full(len(ms["host_s"]), np.nan)
    ms["overlapped"] = np.zeros(len(ms["overlapped"]), dtype=bool)
    return RecordedEvents(events.header, tables, events.last_step, events.complete)


@pytest.mark.parametrize("source,target", DIRECTIONS, ids=[f"{t} from {s}" for s, t in DIRECTIONS])
def test_with_noise_the_makespan_is_still_within_one_percent(monkeypatch, source: str,
                                                             target: str) -> None:
    law, host = StepLaw(noise=0.03, flush_every=64), HostLaw(noise=0.05)
    seeds = {"overlapping": 1, "sequential": 2}
    src = record_workload(CONFIGS[source], REQUESTS, law, seed=seeds[source], host=host)
    tgt = record_workload(CONFIGS[target], REQUESTS, law, seed=seeds[target], host=host)
    result = predict(monkeypatch, src, CONFIGS[source], CONFIGS[target])
    measured = compute(tgt).summary
    assert result.metrics["makespan_s"] == pytest.approx(measured["makespan_s"], rel=0.01)
    assert result.metrics["tpot_p50_s"] == pytest.approx(measured["tpot_p50_s"], rel=0.05)


# --- an eager step's launch time, in both its device and its host time ---------------------------
@dataclass(frozen=True)
class LaunchBoundLaw(CausalLaw):
    """CausalLaw whose eager (prefill, mixed) steps take at least their launch time on the
    device."""

    floor_s: float = 0.0

    def duration(self, batch: ScheduledBatch, padded: int, rng: np.random.Generator,
                 padded_rows: int = 0) -> float:
        seconds = super().duration(batch, padded, rng, padded_rows)
        return max(seconds, self.floor_s) if batch.kind != "decode" else seconds


LAUNCH_S = 6e-3


def test_an_eager_steps_launch_time_is_counted_once(monkeypatch) -> None:
    """A sequential eager step's kernels run while the host launches them: its interval is
    max(device, host) plus the sync latency, not device + host. The offset is measured on the
    source's prefills; for the chunked target's mixed steps, which the source never ran, it is
    the sync latency of the source's other sequential steps."""
    law = LaunchBoundLaw(noise=0.0, flush_every=0, floor_s=LAUNCH_S)
    host = HostLaw(launch_s=LAUNCH_S)
    requests = staggered_requests(lo=20, hi=4000)
    source = record_workload(OVERLAPPING, requests, law, seed=1, host=host)
    chunked = OVERLAPPING.replace(policy="chunked", max_num_batched_tokens=512,
                                  async_scheduling=False)
    target = record_workload(chunked, requests, law, seed=2, host=host)
    x, classes = feature_matrix(target)
    assert (classes == "mixed").sum() > 50
    model = CostModel.fit(source)
    assert model.fits["prefill"].floor == pytest.approx(LAUNCH_S, rel=1e-6)
    assert "mixed" not in model.fits
    offset = model.overlap.offset
    assert offset("sequential", "prefill") == pytest.approx(HOST.sync_s, rel=1e-6)
    assert offset("sequential", "mixed") == pytest.approx(HOST.sync_s, rel=1e-6)
    assert model.overlap.offset_source["sequential"]["mixed"].startswith("derived")
    result = predict(monkeypatch, source, OVERLAPPING, chunked, model)
    measured = compute(target).summary
    assert result.metrics["makespan_s"] == pytest.approx(measured["makespan_s"], rel=1e-6)


# --- the simulated executor ----------------------------------------------------------------------
def _decode_batch(num_seqs: int, overlapped: bool) -> ScheduledBatch:
    seqs = [Sequence(i, [1, 2, 3], SamplingParams(max_tokens=4)) for i in range(num_seqs)]
    return ScheduledBatch(0, "decode", seqs, [1] * num_seqs, [3] * num_seqs, 0,
                          sampled_seqs=seqs, overlapped=overlapped)


def _hand_model(device_s: float, host_s: float, sequential_s: float) -> CostModel:
    zero = (0.0,) * len(FEATURES)
    rule = OverlapModel({"pooled": LinearFit(host_s, zero, (), 8)},
                        offsets={"sequential": {"decode_eager": sequential_s},
                                 "overlapped": {"decode_eager": 0.0}})
    return CostModel({"decode_eager": LinearFit(device_s, zero, (), 8)}, overlap=rule)


@pytest.mark.parametrize("device_s,host_s", [(3e-3, 1e-3), (1e-3, 3e-3)])
def test_the_simulated_executor_applies_the_overlap_rule(device_s: float, host_s: float) -> None:
    sync_s = 2e-4
    clock = SimClock()
    executor = SimExecutor(64, clock, _hand_model(device_s, host_s, sync_s))
    for i in range(2):
        executor.bind(i, [7, 8])
    out = executor.execute(_decode_batch(2, overlapped=False))
    # An eager decode (no CUDA graphs here): its kernels run while the host launches them.
    assert clock.now == pytest.approx(max(device_s, host_s) + sync_s)
    assert out.duration_s == pytest.approx(device_s)
    assert clock.now - out.wait_s == pytest.approx(host_s)  # what the engine records as host_s
    before = clock.now
    out = executor.execute(_decode_batch(2, overlapped=True))
    assert clock.now - before == pytest.approx(max(device_s, host_s))
    assert out.duration_s == pytest.approx(device_s)
    assert executor.overlapped_steps == 1 and executor.steps == 2


# --- modes, storage, reporting -------------------------------------------------------------------
def test_a_trace_without_host_times_stays_in_interval_mode(recordings) -> None:
    plain = record_workload(OVERLAPPING, REQUESTS[:30], LAW)  # a law without host time
    assert np.isnan(np.asarray(plain.tables["model_step"]["host_s"])).all()
    unmeasured = _without_host_times(recordings["overlapping"])
    unmeasured.tables["model_step"]["host_s"] = np.zeros(unmeasured.num_steps)
    for events in (plain, unmeasured):
        model = CostModel.fit(events)
        assert model.mode == "interval" and model.overlap is None
        assert model.to_dict()["target"] == "interval"
        assert "interval mode" in model.describe()


def test_an_interval_model_notes_the_overlap_it_cannot_price(recordings, monkeypatch) -> None:
    blind = _without_host_times(recordings["sequential"])
    result = predict(monkeypatch, blind, SEQUENTIAL, OVERLAPPING)
    assert any("no host time (interval mode)" in note for note in result.notes)


def test_save_and_load_keep_the_overlap_model(recordings, monkeypatch, tmp_path) -> None:
    model = CostModel.fit(recordings["overlapping"], source="A")
    model.save(tmp_path / "model.json")
    loaded = CostModel.load(tmp_path / "model.json")
    assert loaded.mode == "overlap" and loaded.overlap == model.overlap
    x, classes = feature_matrix(recordings["sequential"])
    flags = np.arange(len(x)) % 2 == 0
    assert predicted_intervals(loaded, x, classes, flags) == pytest.approx(
        predicted_intervals(model, x, classes, flags))
    first = predict(monkeypatch, recordings["overlapping"], OVERLAPPING, SEQUENTIAL, model)
    again = predict(monkeypatch, recordings["overlapping"], OVERLAPPING, SEQUENTIAL, loaded)
    assert again.metrics == first.metrics


def test_the_host_spread_is_opt_in_and_prices_an_overlapped_step_over_it() -> None:
    """A source whose host work (about its device time) carries 20% lognormal noise. By default
    an overlapped step is priced at its mean host time (no spread; the options name none). With
    ``host_spread=on`` (in the model's options) the model keeps SPREAD_QUANTILES levels of mean 1
    about the host fit, about as wide as the noise, and prices an overlapped decode at the mean
    of max(device, host x level) plus its offset: above max(device, host), as the steps whose
    host work outlasts the device pay the difference. A sequential step is priced alike."""
    host = HostLaw(base_s=2.5e-3, noise=0.2)
    source = record_workload(OVERLAPPING, REQUESTS, LAW, seed=1, host=host)
    default = CostModel.fit(source)
    spread = CostModel.fit(source, options=CostOptions(host_spread=True))
    assert default.overlap.spread == () and "host_spread" not in default.options
    assert spread.options["host_spread"] is True
    levels = spread.overlap.spread
    assert len(levels) == SPREAD_QUANTILES and np.mean(levels) == pytest.approx(1.0)
    assert levels[0] < 0.8 and levels[-1] > 1.2
    x, classes = feature_matrix(source, causal=spread.causal_work)
    row = x[np.flatnonzero(classes == "decode_graph")[-1]].tolist()
    plain, priced = (m.predict(row, "decode_graph", overlapped=True) for m in (default, spread))
    assert (priced.device_s, priced.host_s) == (plain.device_s, plain.host_s)
    offset = spread.overlap.offset("overlapped", "decode_graph")
    assert plain.interval_s == pytest.approx(max(plain.device_s, plain.host_s) + offset)
    assert priced.interval_s == pytest.approx(
        np.mean([max(priced.device_s, priced.host_s * r) for r in levels]) + offset)
    assert priced.interval_s > plain.interval_s * 1.01
    assert (spread.predict(row, "decode_graph").interval_s
            == default.predict(row, "decode_graph").interval_s)


def test_a_source_without_overlapped_steps_says_what_it_cannot_measure(recordings) -> None:
    model = CostModel.fit(recordings["sequential"])
    assert overlapped_fraction(recordings["sequential"]) == 0.0
    assert model.overlap.offset("overlapped", "decode_graph") == 0.0
    assert any("decode_graph: too few overlapped steps" in line for line in model.caveats())


def test_the_engines_own_launch_decisions_are_priced(monkeypatch) -> None:
    """Recorded and simulated with EngineCore's ``ScheduledBatch.overlapped``, not the rule."""
    host = HostLaw(follow_engine=True)
    source = record_workload(OVERLAPPING, REQUESTS, LAW, seed=1, host=host)
    if overlapped_fraction(source) == 0.0:
        pytest.skip("EngineCore does not launch any step overlapped (yet)")
    target = record_workload(SEQUENTIAL, REQUESTS, LAW, seed=2, host=host)
    for src, src_config, tgt, tgt_config in ((source, OVERLAPPING, target, SEQUENTIAL),
                                             (target, SEQUENTIAL, source, OVERLAPPING)):
        result = simulate(src, overrides_between(src_config, tgt_config))
        measured = compute(tgt).summary
        assert result.metrics["makespan_s"] == pytest.approx(measured["makespan_s"], rel=0.01)


def _calibration_rows(config: Config, law: StepLaw, host: HostLaw) -> list[dict]:
    """The header's start-up calibration (engine/calibration.py) as the law times it, with the
    time the executor waited for the device: its interval by the law, less its host work."""
    from engine.calibration import calibration_batches
    from engine.engine_core import batch_features
    from replay.whatif.synthetic import nano_padded

    rows = []
    for batch in calibration_batches(config):
        batch.step = 10**6  # the law's first-step terms are for run steps only
        padded = nano_padded(len(batch.seqs)) if batch.kind == "decode" else 0
        device = law.duration(batch, padded, np.random.default_rng(0))
        host_s = host.base_s + (0.0 if padded else host.launch_s)
        interval = host.interval(device, host_s, overlapped=False, eager=not padded)
        wait = interval - host_s
        prefill_tokens, work, decode_seqs, context = batch_features(batch)
        rows.append({
            "kind": batch.kind, "num_seqs": len(batch.seqs), "prefill_tokens": prefill_tokens,
            "prefill_attn_work": work, "decode_seqs": decode_seqs,
            "decode_context_tokens": context, "padded_batch_size": padded or len(batch.seqs),
            "graph_used": bool(padded), "interval_s": interval, "duration_s": device,
            "wait_s": wait,
        })
    return rows


def test_a_source_that_overlapped_nearly_every_step_learns_the_rest_from_its_calibration(
    monkeypatch,
) -> None:
    """Like the H200 reference run: every request at once, a few prefills (all in the warm-up
    window), then overlapped decodes; predicted: a constrained run, sequential, preempting and
    recomputing (small prefills on the launch floor). What a sequential step pays beyond device
    and host time is unmeasurable on such a source; calibration steps that record their wait
    for the device measure it. Fitted without ``relative_roofline``: its prefill fit has 7
    calibration rows, 5 of them on the launch floor, too few for the relative refit, which picks
    a roofline slope the law lacks (BENCHMARKS 7m)."""
    from replay.workloads.builtin import reference_workload

    law = LaunchBoundLaw(noise=0.0, flush_every=0, floor_s=LAUNCH_S)
    host = HostLaw(launch_s=LAUNCH_S)
    requests = reference_workload(num_seqs=128)
    reference = Config(num_kvcache_blocks=800, max_num_seqs=128)
    constrained = Config(num_kvcache_blocks=360, max_num_seqs=96, async_scheduling=False)
    source = record_workload(reference, requests, law, seed=1, host=host)
    target = record_workload(constrained, requests, law, seed=2, host=host)
    assert overlapped_fraction(source) > 0.99 and overlapped_fraction(target) == 0.0
    measured = compute(target).summary

    options = CostOptions(relative_roofline=False)
    blind = CostModel.fit(source, options=options)
    assert any("too few sequential steps" in line for line in blind.caveats())
    missed = predict(monkeypatch, source, reference, constrained, blind).metrics
    assert abs(missed["makespan_s"] / measured["makespan_s"] - 1) > 0.02

    source.header["calibration"] = _calibration_rows(reference, law, host)
    model = CostModel.fit(source, options=options)
    assert model.overlap.offset("sequential", "decode_graph") == pytest.approx(host.sync_s)
    assert model.overlap.offset("sequential", "prefill") == pytest.approx(host.sync_s)
    result = predict(monkeypatch, source, reference, constrained, model)
    assert result.metrics["makespan_s"] == pytest.approx(measured["makespan_s"], rel=0.01)
    assert result.metrics["ttft_mean_s"] == pytest.approx(measured["ttft_mean_s"], rel=0.05)


@pytest.mark.parametrize("later_steps,expected_ms,how", [
    (3, 1.9, "median of 3 steps"),  # the run's own overhead, its first step's stall left out
    (2, 0.04, "measured on 1 calibration steps"),  # too few: the start-up calibration's
])
def test_a_class_with_few_steps_takes_its_offset_from_them_not_the_calibration(
    later_steps: int, expected_ms: float, how: str
) -> None:
    """A constrained run has only a handful of sequential eager prefills (its first steps). Their
    residual over the rule (~1.9 ms of scheduling and recording around the executor call) is the
    run's own; a calibration step, an executor call alone, misses it. With fewer than
    FEW_OFFSET_STEPS of them besides the first, the calibration's figure stands."""
    prefill_ms = [10.3, 1.5, 1.9, 1.9][: 1 + later_steps]
    classes = np.array(["prefill"] * len(prefill_ms) + ["decode_graph"] * 20)
    residual = np.array(prefill_ms + [-0.3] * 20) / 1e3

    def sequential_steps(classes: np.ndarray, residual: np.ndarray) -> Steps:
        """Sequential steps without device or host time whose intervals exceed the rule's
        (its least step time) by ``residual``."""
        n, no = len(classes), np.zeros(len(classes), dtype=bool)
        return Steps(x=np.zeros((n, len(FEATURES))), classes=classes, time=np.zeros(n),
                     host=np.zeros(n), interval=residual + MIN_STEP_S, overlapped=no,
                     is_calibration=no, window=no)

    model = OverlapModel(host={})
    model._fit_offsets(sequential_steps(classes, residual),
                       sequential_steps(np.array(["prefill"]), np.array([0.04e-3])))
    assert model.offset("sequential", "prefill") == pytest.approx(expected_ms / 1e3)
    assert model.offset_source["sequential"]["prefill"].startswith(how)
