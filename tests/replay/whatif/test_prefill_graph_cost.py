"""CUDA-graph prefills (trace schema 3) in the step-time model and the what-if simulator.

What these tests prove, on synthetic recordings whose prefills run through CUDA graphs where the
engine would run them so (``record_workload(prefill_graphs=True)``: padded to a captured token
count, the per-token cost paid on every padded row, no eager launch time):
- the source's graph prefills get a class of their own, ``prefill_graph``, fitted on the padded
  token count: held-out error ~0 without noise and about the noise with it, its prediction moving
  with the padded tokens, not the prompt's; a sequential one is priced device + host + offset;
- the simulator pads a prefill as the engine does, among the source's captured counts that the
  target config captures: ``prefill_graph_tokens=0`` (or ``enforce_eager``) makes every prefill
  eager, a lower limit makes the larger ones eager, too many prompts make one eager; and another
  config's measured makespan is predicted;
- a source that captured graphs but timed no prefill through one prices them from its eager
  prefill fit's compute part, and says so; the captured counts come from the trace header, else
  from the padded counts the source recorded;
- an older trace (no ``padded_tokens`` content, no prefill graphs in its header) fits and
  simulates exactly as before: no graph prefills, the same predictions with or without the
  column;
- the new model fields survive save/load.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cost_helpers import CausalLaw, predicted_intervals

from engine.config import Config
from engine.graph_sizes import padded_prefill_tokens, prefill_graph_sizes
from replay.metrics import compute
from replay.recorded import RecordedEvents
from replay.verify import compare_decisions
from replay.whatif.cost.features import (
    FEATURES,
    calibration_features,
    feature_matrix,
    step_intervals,
)
from replay.whatif.cost.model import CostModel
from replay.whatif.simulate import simulate
from replay.whatif.synthetic import HostLaw, StepLaw, record_workload
from replay.workloads.request import Request

LAW = CausalLaw(noise=0.0, flush_every=0)
# An eager step's launch time (host and device alike); a graph prefill does not pay it.
LAUNCH_S = 6e-3
HOST = HostLaw(launch_s=LAUNCH_S, follow_engine=True)
# Room for prompts above a 4,096-token graph limit, which run eager; graphs of 16 prompts.
CONFIG = Config(num_kvcache_blocks=900, max_model_len=8192, prefill_graph_tokens=4096,
                prefill_graph_seqs=16)
GRAPH_SEQS = CONFIG.prefill_graph_seqs
BURST = 20  # short prompts at time 0: one prefill of more sequences than a graph takes
LARGEST_PROMPT = 6000


def requests(count: int = 120, lo: int = 20, hi: int = LARGEST_PROMPT, seed: int = 0,
             burst: int = BURST) -> list[Request]:
    """A burst of short prompts, then prompts of lo..hi tokens arriving one by one."""
    rng = np.random.default_rng(seed)
    first = [Request(rng.integers(0, 9000, size=int(rng.integers(40, 60))).tolist(), 30)
             for _ in range(burst)]
    return first + [Request(rng.integers(0, 9000, size=int(rng.integers(lo, hi))).tolist(),
                            int(rng.integers(20, 200)), arrival_s=0.1 + 0.03 * i)
                    for i in range(count)]


@pytest.fixture(scope="module")
def source() -> RecordedEvents:
    return record_workload(CONFIG, requests(), LAW, host=HOST, prefill_graphs=True)


@pytest.fixture(scope="module")
def model(source: RecordedEvents) -> CostModel:
    return CostModel.fit(source, source="graphs")


def prefill_steps(events: RecordedEvents) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per prefill step: its class, tokens, sequences and recorded padded_tokens."""
    x, classes = feature_matrix(events)
    ms = events.tables["model_step"]
    rows = np.asarray(ms["kind"]).astype(str) == "prefill"
    return (classes[rows], x[rows, FEATURES.index("prefill_tokens")].astype(int),
            x[rows, FEATURES.index("num_seqs")].astype(int),
            np.asarray(ms["padded_tokens"], dtype=int)[rows])


def expected_padding(tokens: np.ndarray, seqs: np.ndarray, limit: int,
                     max_seqs: int = GRAPH_SEQS) -> np.ndarray:
    sizes = prefill_graph_sizes(limit)
    return np.array([padded_prefill_tokens(sizes, int(t), int(s), max_seqs)
                     for t, s in zip(tokens, seqs)])


# --- (a) the source's graph prefills: their own class, fitted on padded tokens -------------------
def test_graph_prefills_get_a_class_fitted_on_padded_tokens(source, model) -> None:
    classes, tokens, seqs, padded = prefill_steps(source)
    assert (classes == "prefill_graph").sum() > 50 and (classes == "prefill").sum() > 10
    assert (padded[classes == "prefill_graph"] >= tokens[classes == "prefill_graph"]).all()
    fit = model.fits["prefill_graph"]
    assert "padded_tokens" in fit.features and "prefill_tokens" not in fit.features
    assert fit.coef[FEATURES.index("padded_tokens")] == pytest.approx(LAW.per_prefill_token_s,
                                                                      rel=1e-6)
    assert model.heldout["prefill_graph"]["mape_pct"] < 0.01
    assert model.selection["prefill_graph"]["chosen"].startswith("padded_tokens")
    # One prompt of 600 tokens, padded to 1,024 or (a coarser capture) to 1,536: the padding is
    # what the prediction follows.
    row = np.zeros((2, len(FEATURES)))
    row[:, FEATURES.index("num_seqs")] = 1
    row[:, FEATURES.index("prefill_tokens")] = 600
    row[:, FEATURES.index("prefill_attn_work")] = 600 * 601 // 2
    row[:, FEATURES.index("padded_tokens")] = (1024, 1536)
    low, high = model.fitted_times(row, np.array(["prefill_graph"] * 2))
    assert high - low == pytest.approx(512 * LAW.per_prefill_token_s, rel=1e-6)
    assert "prefill CUDA graphs: 13 token counts, 16 to 4,096" in model.describe()


def test_with_noise_the_held_out_error_is_about_the_noise() -> None:
    noisy = record_workload(CONFIG, requests(), StepLaw(noise=0.03, flush_every=0), host=HOST,
                            prefill_graphs=True)
    mape = CostModel.fit(noisy).heldout["prefill_graph"]["mape_pct"]
    assert 1.0 < mape < 4.0  # the mean absolute value of 3% lognormal noise is about 2.4%


def test_a_graph_prefill_is_priced_device_plus_host_not_launch_bound(source, model) -> None:
    assert model.overlap is not None
    host = model.overlap.host_fit("prefill_graph")
    assert host.intercept == pytest.approx(HOST.base_s, rel=1e-6)  # no launch time
    assert model.overlap.host_fit("prefill").intercept == pytest.approx(
        HOST.base_s + LAUNCH_S, rel=1e-6)
    x, classes = feature_matrix(source, causal=model.causal_work)
    graph = classes == "prefill_graph"
    overlapped = np.asarray(source.tables["model_step"]["overlapped"], dtype=bool)
    assert not overlapped[graph].any()  # a prefill is never launched overlapped
    predicted = predicted_intervals(model, x[graph], classes[graph], overlapped[graph])
    assert predicted == pytest.approx(step_intervals(source)[graph], rel=1e-6)


# --- (b) the simulator pads prefills as the target config's engine would -------------------------
@pytest.mark.parametrize("overrides,limit", [
    ({}, 4096),
    ({"prefill_graph_tokens": 1024}, 1024),
    ({"prefill_graph_tokens": 0}, 0),
    ({"enforce_eager": True}, 0),
    ({"policy": "chunked", "max_num_batched_tokens": 2048}, 2048),
    ({"prefill_graph_seqs": 2}, 4096),
], ids=["default", "limit-1024", "graphs-off", "enforce-eager", "chunked-budget-2048",
        "two-prompts-a-graph"])
def test_the_simulator_pads_prefills_as_the_target_engine_would(source, model, overrides,
                                                                 limit) -> None:
    result = simulate(source, overrides, timing=model)
    assert result.ok and result.events is not None
    classes, tokens, seqs, padded = prefill_steps(result.events)
    # The target's prompts per graph bound the source's (a target cannot take more than the
    # source captured: no step of such a graph was ever timed).
    max_seqs = min(GRAPH_SEQS, overrides.get("prefill_graph_seqs", GRAPH_SEQS))
    expected = (expected_padding(tokens, seqs, limit, max_seqs) if limit
                else np.zeros(len(tokens), int))
    assert (padded == expected).all()
    assert (classes == np.where(expected > 0, "prefill_graph", "prefill")).all()
    if limit:
        assert (classes == "prefill_graph").any()
        assert (classes[seqs > max_seqs] == "prefill").all()  # the burst, at least
        assert (classes[seqs > GRAPH_SEQS] == "prefill").sum() == 1
    else:
        assert (classes == "prefill").all()
    if "enforce_eager" in overrides:
        return  # eager decodes, which the source never ran: not priced exactly, nor timed alike
    # The recording under the same config pads the same (it decides as the engine does), and
    # its makespan is what the simulation predicts.
    target_config = CONFIG.replace(**overrides)
    measured = record_workload(target_config, requests(), LAW, host=HOST, prefill_graphs=True)
    if overrides.get("policy") == "chunked":
        # Its mixed steps run from mixed graphs (as the engine's runner captures them), a class
        # the prefill-first source never ran: priced from its prefill-graph fit, so not exactly,
        # and arrivals then join at other steps. Every mixed step is a graph step in both, and
        # the makespan holds within the fidelity target.
        for events in (measured, result.events):
            steps = events.tables["model_step"]
            mixed = np.asarray(steps["kind"]).astype(str) == "mixed"
            assert mixed.any() and np.asarray(steps["graph_used"], dtype=bool)[mixed].all()
        assert result.metrics["makespan_s"] == pytest.approx(
            compute(measured).summary["makespan_s"], rel=0.03)
        return
    assert compare_decisions(measured, result.events) is None
    assert prefill_steps(measured)[3].tolist() == padded.tolist()
    assert result.metrics["makespan_s"] == pytest.approx(
        compute(measured).summary["makespan_s"], rel=0.01)


def test_a_limit_above_the_sources_captures_is_noted(source, model) -> None:
    result = simulate(source, {"prefill_graph_tokens": 8192}, timing=model)
    assert any("captured them up to 4,096" in note for note in result.notes)
    classes, tokens, _, _ = prefill_steps(result.events)
    assert (classes[tokens > 4096] == "prefill").all()


# --- a source that timed no graph prefill, and where the captured counts come from ---------------
def test_graph_prefills_the_source_never_timed_are_priced_from_its_eager_prefills() -> None:
    large = record_workload(CONFIG, requests(lo=4200, burst=0), LAW, host=HOST,
                            prefill_graphs=True)
    model = CostModel.fit(large, source="large-prompts")
    assert "prefill_graph" not in model.fits and model.prefill_graph_sizes
    assert any("no step it timed ran through one" in line for line in model.caveats())
    small = requests(hi=3000, seed=1, burst=0)  # one prompt a prefill, as in the source
    measured = record_workload(CONFIG, small, LAW, host=HOST, prefill_graphs=True)
    result = simulate(measured, {}, timing=model)
    assert any("prefill_graph steps: the source has none of its own; predicted from the eager "
               "prefill fit's compute part" in note for note in result.notes)
    # The law's graph prefill is its eager compute at the padded count: recovered, up to the
    # eager fit's extrapolation from its 4,200+ token prompts down to the graphs' sizes.
    assert result.metrics["makespan_s"] == pytest.approx(
        compute(measured).summary["makespan_s"], rel=1e-3)


def test_captured_counts_come_from_the_header_else_from_the_steps(source, model) -> None:
    assert model.prefill_graph_sizes == prefill_graph_sizes(4096)
    assert model.prefill_graph_max_seqs == GRAPH_SEQS
    executor = {k: v for k, v in source.header["executor"].items()
                if not k.startswith("prefill_graph")}
    bare = RecordedEvents({**source.header, "executor": executor}, source.tables,
                          source.last_step)
    assert CostModel.fit(bare).prefill_graph_sizes == prefill_graph_sizes(4096)
    # Padding the engine's sizes cannot explain: only the counts seen are known.
    ms = dict(bare.tables["model_step"])
    padded = np.asarray(ms["padded_tokens"]).copy()
    padded[padded == 1024] = 1100
    ms["padded_tokens"] = padded
    odd = RecordedEvents(bare.header, {**bare.tables, "model_step": ms}, bare.last_step)
    seen = sorted(set(padded[padded > 0].tolist()))
    assert CostModel.fit(odd).prefill_graph_sizes == seen


# --- (c) an older trace: no prefill graphs, fitted and simulated exactly as before ---------------
@pytest.fixture(scope="module")
def older() -> RecordedEvents:
    return record_workload(CONFIG, requests(), LAW, host=HOST)


def test_an_older_trace_fits_and_simulates_as_before(older) -> None:
    assert not np.asarray(older.tables["model_step"]["padded_tokens"]).any()
    model = CostModel.fit(older)
    assert "prefill_graph" not in model.fits and model.prefill_graph_sizes == []
    assert all(fit.coef[FEATURES.index("padded_tokens")] == 0.0 for fit in model.fits.values())
    # Without the column at all (a reader that did not fill it), the same model.
    ms = {k: v for k, v in older.tables["model_step"].items() if k != "padded_tokens"}
    bare = RecordedEvents(older.header, {**older.tables, "model_step": ms}, older.last_step)
    x, classes = feature_matrix(bare)
    assert (x[:, FEATURES.index("padded_tokens")] == x[:, FEATURES.index("prefill_tokens")]
            + x[:, FEATURES.index("decode_seqs")]).all()
    assert CostModel.fit(bare).fitted_times(x, classes) == pytest.approx(
        model.fitted_times(x, classes), rel=1e-12)
    # The config allows prefill graphs, but the source captured none: all prefills stay eager.
    on = simulate(older, {}, timing=model)
    off = simulate(older, {"prefill_graph_tokens": 0}, timing=model)
    assert not np.asarray(on.events.tables["model_step"]["padded_tokens"]).any()
    assert on.metrics == off.metrics
    assert on.metrics["makespan_s"] == pytest.approx(compute(older).summary["makespan_s"],
                                                     rel=1e-6)
    asked = simulate(older, {"prefill_graph_tokens": 2048}, timing=model)
    assert any("captured no prefill CUDA graphs" in note for note in asked.notes)


def test_calibration_rows_without_padded_tokens_computed_their_own() -> None:
    base = {"num_seqs": 1, "prefill_tokens": 100, "prefill_attn_work": 5050, "decode_seqs": 0,
            "decode_context_tokens": 0, "padded_batch_size": 1}
    x = calibration_features([base, {**base, "padded_tokens": 0},
                              {**base, "padded_tokens": 128}])
    assert x[:, FEATURES.index("padded_tokens")].tolist() == [100, 100, 128]


# --- (d) save/load --------------------------------------------------------------------------------
def test_the_prefill_graph_fields_round_trip(source, model, tmp_path) -> None:
    model.save(tmp_path / "model.json")
    loaded = CostModel.load(tmp_path / "model.json")
    assert loaded.prefill_graph_sizes == model.prefill_graph_sizes
    assert loaded.prefill_graph_max_seqs == model.prefill_graph_max_seqs
    assert loaded.fits == model.fits
    x, classes = feature_matrix(source)
    assert predicted_intervals(loaded, x, classes) == pytest.approx(
        predicted_intervals(model, x, classes))
    assert simulate(source, {}, timing=loaded).metrics == simulate(source, {},
                                                                    timing=model).metrics


def test_a_target_taking_fewer_prompts_a_graph_runs_the_larger_prefills_eager() -> None:
    """``prefill_graph_seqs`` of the target bounds the source's graphs: a prefill of six prompts,
    a graph prefill in the source, runs eager under a target whose graphs take four."""
    burst = 6
    source = record_workload(CONFIG, requests(count=20, burst=burst), LAW, host=HOST,
                             prefill_graphs=True)
    timing = CostModel.fit(source, source="graphs")
    for seqs_a_graph, expected in ((GRAPH_SEQS, "prefill_graph"), (burst - 2, "prefill")):
        result = simulate(source, {"prefill_graph_seqs": seqs_a_graph}, timing=timing)
        assert result.ok and result.events is not None
        classes, tokens, seqs, _ = prefill_steps(result.events)
        assert classes[seqs == burst].tolist() == [expected]
        assert (classes[(seqs == 1) & (tokens <= 4096)] == "prefill_graph").all()


def test_a_recording_with_16k_prefill_graphs_is_simulated_with_the_same_graphs() -> None:
    """traces/matrix-s14/reference-default-3 (prefill graphs to 16,384 tokens and 64 prompts):
    re-simulated under its own config, each of its nine ~16k-token, ~29-prompt prefills pads to
    the graph it replayed; with the graphs of the engine before (4,096 tokens, 16 prompts) every
    one runs eager."""
    from replay.recorded import from_trace
    from tracing.reader import read_trace

    source = from_trace(read_trace("traces/matrix-s14/reference-default-3"))
    recorded_classes, _, seqs, recorded_padded = prefill_steps(source)
    assert (recorded_classes == "prefill_graph").all() and (seqs > 16).all()
    timing = CostModel.fit(source, source="s14")
    same = simulate(source, {}, timing=timing)
    assert same.ok and same.events is not None
    classes, _, _, padded = prefill_steps(same.events)
    assert (classes == "prefill_graph").all() and (padded == recorded_padded).all()
    before = simulate(source, {"prefill_graph_tokens": 4096, "prefill_graph_seqs": 16},
                      timing=timing)
    assert before.ok and before.events is not None
    assert (prefill_steps(before.events)[0] == "prefill").all()
