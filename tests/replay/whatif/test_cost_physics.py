"""The step-time model's physical pieces: the engine's host work that a timed executor call
lacks (a step's and a prompt token's), host slopes of a class's own, an overlapped step priced
over the spread of its host times, graph or eager taken from the step itself, and the matrix
studies (per-class step errors, the ablation's summary)."""

from __future__ import annotations

import numpy as np
import pytest

from replay.whatif.cost.features import FEATURES, LinearFit, Steps, class_fit, step_class
from replay.whatif.cost.fit import fit_host, holdout_mask
from replay.whatif.cost.lstsq import fit_grouped
from replay.whatif.cost.options import CostOptions
from replay.whatif.cost.overlap import (
    SPREAD_QUANTILES,
    OverlapModel,
    engine_host_s,
    engine_token_s,
    host_spread,
    interval,
    intervals,
)
from replay.whatif.matrix_study import (
    OPT_IN,
    SWITCHES,
    ablation_markdown,
    ablation_summary,
    ablation_variants,
)


def _steps(classes: list[str], seqs: list[float], host: list[float],
           tokens: list[float] | None = None, overlapped: list[bool] | None = None) -> Steps:
    n = len(classes)
    x = np.zeros((n, len(FEATURES)))
    x[:, FEATURES.index("num_seqs")] = seqs
    if tokens is not None:
        x[:, FEATURES.index("prefill_tokens")] = tokens
    no = np.zeros(n, dtype=bool)
    launched = no.copy() if overlapped is None else np.array(overlapped, dtype=bool)
    return Steps(x=x, classes=np.array(classes), time=np.full(n, 1e-3), host=np.array(host),
                 interval=np.full(n, 2e-3), overlapped=launched, is_calibration=no,
                 window=no.copy())


def test_engine_host_work_is_what_real_steps_take_beyond_their_calibration_steps() -> None:
    """Calibration decodes take 0.3 ms + 1 us per sequence on the host; the run's decodes take
    0.4 ms more at every size: that 0.4 ms is the engine's own work per step."""
    seqs = [1.0, 16.0, 64.0]
    calibration = _steps(["decode_graph"] * 3, seqs, [3e-4 + 1e-6 * s for s in seqs])
    run_seqs = list(np.linspace(1, 200, 40))
    run = _steps(["decode_graph"] * 40, run_seqs, [7e-4 + 1e-6 * s for s in run_seqs])
    assert engine_host_s(run, calibration) == pytest.approx(4e-4, rel=1e-6)
    # No class with both real and calibration steps: nothing to measure it by.
    assert engine_host_s(run, _steps(["prefill_graph"] * 3, seqs, [3e-4] * 3)) == 0.0


# Host work of a prefill by a known law: a + c x sequences + b x prompt tokens (calibration),
# and the engine's own ENGINE_S a step and ENGINE_TOKEN_S a prompt token more (the run).
A_S, PER_SEQ_S, PER_TOKEN_S, ENGINE_S, ENGINE_TOKEN_S = 3e-4, 2e-6, 5e-8, 4e-4, 3e-8


def _prefill_law(seqs: list[float], tokens: list[float], run: bool) -> list[float]:
    extra = (ENGINE_S, ENGINE_TOKEN_S) if run else (0.0, 0.0)
    return [A_S + extra[0] + PER_SEQ_S * s + (PER_TOKEN_S + extra[1]) * n
            for s, n in zip(seqs, tokens)]


def _prefill_run(rng: np.random.Generator, prompts: list[float] | None = None) -> Steps:
    """The run's 12 prefills (64..1,024 tokens of ``prompts`` prompts each, default 1..4 at
    random; by ``_prefill_law``) and 40 decodes, more frequent, whose host work is 0.3 ms +
    ENGINE_S + PER_SEQ_S x sequences (no prompt token)."""
    seqs = prompts or rng.integers(1, 5, 12).astype(float).tolist()
    tokens = rng.integers(64, 1025, len(seqs)).astype(float).tolist()
    dec_seqs = np.linspace(1, 200, 40).tolist()
    prefill = _steps(["prefill"] * len(seqs), seqs, _prefill_law(seqs, tokens, run=True), tokens)
    decode = _steps(["decode_graph"] * len(dec_seqs), dec_seqs,
                    [3e-4 + ENGINE_S + PER_SEQ_S * s for s in dec_seqs])
    return decode.concat(prefill)


CAL_SEQS, CAL_TOKENS = [1.0, 2.0, 4.0, 1.0, 8.0, 2.0], [16.0, 128.0, 512.0, 2048.0, 4096.0, 8192.0]


def test_the_engines_work_per_prompt_token_is_what_run_prefills_take_beyond_calibration() -> None:
    """Calibration prefills take a + c x sequences + b x tokens on the host; the run's prefills
    take ENGINE_S more a step and ENGINE_TOKEN_S more a prompt token: ``engine_token_s``, given
    ENGINE_S, recovers ENGINE_TOKEN_S from the prefills (the run's more frequent decodes, no
    prefill class, are passed over). Where no prefill class has calibration steps there is
    nothing to measure it by: 0."""
    run = _prefill_run(np.random.default_rng(0))
    calibration = _steps(["prefill"] * 6, CAL_SEQS, _prefill_law(CAL_SEQS, CAL_TOKENS, False),
                         CAL_TOKENS)
    assert engine_token_s(run, calibration, ENGINE_S) == pytest.approx(ENGINE_TOKEN_S, rel=1e-6)
    decodes_only = _steps(["decode_graph"] * 3, [1.0, 16.0, 64.0],
                          [3e-4 + PER_SEQ_S * s for s in (1.0, 16.0, 64.0)])
    assert engine_token_s(run, decodes_only, ENGINE_S) == 0.0


def test_calibration_prefills_are_charged_the_engines_work_per_token_too() -> None:
    """``OverlapModel.fit`` measures ENGINE_S on the decodes and ENGINE_TOKEN_S on the prefills,
    and charges both to each calibration step: the host fit of the prefills is then the run's
    law up to 8,192 tokens, eight times the longest prompt the run scheduled, and the decodes'
    is theirs."""
    run = _prefill_run(np.random.default_rng(1), prompts=[1.0] * 12)
    ones, decode_seqs = [1.0] * len(CAL_TOKENS), [1.0, 16.0, 64.0]
    host = _prefill_law(ones, CAL_TOKENS, run=False) + [3e-4 + PER_SEQ_S * s
                                                        for s in decode_seqs]
    calibration = _steps(["prefill"] * len(ones) + ["decode_graph"] * 3, ones + decode_seqs,
                         host, CAL_TOKENS + [0.0] * 3)
    model = OverlapModel.fit(run, calibration)
    assert model.engine_s == pytest.approx(ENGINE_S, rel=1e-6)
    assert model.engine_token_s == pytest.approx(ENGINE_TOKEN_S, rel=1e-6)
    prefills = calibration.x[: len(ones)]
    assert model.host_fit("prefill").predict(prefills) == pytest.approx(
        _prefill_law(ones, CAL_TOKENS, run=True), rel=1e-6)
    decodes = run.classes == "decode_graph"
    assert model.host_fit("decode_graph").predict(run.x[decodes]) == pytest.approx(
        run.host[decodes], rel=1e-6)


def _two_prefill_classes(rows: int = 4, correlated: bool = False
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host work by class: a graph prefill stages 1e-8 s a token, an eager one launches 2e-7 s a
    token; both take 5e-6 s a sequence. Each prefill class's steps: every pair of 1..8 sequences
    and 64..4,096 tokens; and ``rows`` mixed steps of 2 sequences and 3e-7 s a token. Within a
    class, sequences and tokens do not move together (``correlated``: the graph prefill's
    tokens are 512 a sequence, as real prompts' are)."""
    grid = [(s, n) for s in (1.0, 2.0, 4.0, 8.0) for n in (64.0, 256.0, 1024.0, 4096.0)]
    laws = {"prefill_graph": (1e-4, 1e-8), "prefill": (3e-4, 2e-7), "mixed": (2e-4, 3e-7)}
    cells = [(name, s, 512.0 * s if correlated and name == "prefill_graph" else n)
             for name in ("prefill_graph", "prefill") for s, n in grid]
    cells += [("mixed", 2.0, n) for n in (128.0, 512.0, 2048.0, 8192.0)[:rows]]
    x = np.zeros((len(cells), len(FEATURES)))
    x[:, FEATURES.index("num_seqs")] = [s for _, s, _ in cells]
    x[:, FEATURES.index("prefill_tokens")] = [n for _, _, n in cells]
    y = np.array([laws[name][0] + 5e-6 * s + laws[name][1] * n for name, s, n in cells])
    return x, y, np.array([name for name, _, _ in cells])


@pytest.mark.parametrize("correlated", [False, True])
def test_a_class_with_the_rows_for_it_fits_its_own_token_slope(correlated: bool) -> None:
    """``fit_grouped(own=("prefill_tokens",))``: the graph and the eager prefill (16 steps each)
    each recover their own token slope and constant exactly, beside the shared per-sequence
    slope, in one least squares (so also where a class's tokens grow with its sequences); the
    mixed class, with fewer steps than ``own_min_rows``, gets the token slope of the classes
    without one of their own (its own rows here: exact too). One slope shared by all classes
    (no ``own``) is none of theirs: it prices the graph prefill's tokens at the eager
    launches'."""
    x, y, classes = _two_prefill_classes(correlated=correlated)
    names = ("num_seqs", "prefill_tokens")
    fits = fit_grouped(x, y, classes, names, own=("prefill_tokens",), own_min_rows=8)
    tokens, seqs = FEATURES.index("prefill_tokens"), FEATURES.index("num_seqs")
    for name, (intercept, slope) in {"prefill_graph": (1e-4, 1e-8), "prefill": (3e-4, 2e-7),
                                     "mixed": (2e-4, 3e-7)}.items():
        assert fits[name].intercept == pytest.approx(intercept, rel=1e-6)
        assert fits[name].coef[tokens] == pytest.approx(slope, rel=1e-6)
        assert fits[name].coef[seqs] == pytest.approx(5e-6, rel=1e-6)
        assert set(fits[name].features) == set(names)
        assert fits[name].predict(x[classes == name]) == pytest.approx(y[classes == name],
                                                                       rel=1e-9)
    shared = fit_grouped(x, y, classes, names)
    assert shared["prefill_graph"].coef[tokens] == shared["mixed"].coef[tokens]
    if not correlated:
        assert not any(shared["mixed"].coef[tokens] == pytest.approx(slope, rel=0.1)
                       for slope in (1e-8, 2e-7, 3e-7))


def test_an_own_slope_that_comes_out_negative_is_given_up() -> None:
    """A class whose host time falls with its tokens (noise, collinearity) gets no negative own
    slope: it shares the other classes' slope again, so more tokens never cost less."""
    x, y, classes = _two_prefill_classes()
    graph = classes == "prefill_graph"
    y = y.copy()
    y[graph] = 1e-3 - 1e-8 * x[graph, FEATURES.index("prefill_tokens")]
    fits = fit_grouped(x, y, classes, ("num_seqs", "prefill_tokens"),
                       own=("prefill_tokens",), own_min_rows=8)
    tokens = FEATURES.index("prefill_tokens")
    assert all(fit.coef[tokens] >= 0 for fit in fits.values())
    assert fits["prefill_graph"].coef[tokens] == fits["mixed"].coef[tokens]
    assert fits["prefill"].coef[tokens] == pytest.approx(2e-7, rel=1e-3)


def test_the_host_fit_scores_each_class_alike_and_fits_token_slopes_of_their_own() -> None:
    """``fit_host`` on 160 decodes (host work by sequences alone) and 16 steps each of a graph
    and an eager prefill (different work per token): each candidate's score is the mean over
    classes of each class's held-out error (the 6 held-out prefills weigh two thirds, not 6 of
    38); the token slope is chosen, and each prefill's is its own."""
    x, y, classes = _two_prefill_classes(rows=0)
    decode_seqs = np.linspace(1, 256, 160)
    xd = np.zeros((len(decode_seqs), len(FEATURES)))
    xd[:, FEATURES.index("num_seqs")] = decode_seqs
    x, classes = np.vstack([x, xd]), np.concatenate([classes, ["decode_graph"] * 160])
    y = np.concatenate([y, 2e-4 + 5e-6 * decode_seqs])
    no = np.zeros(len(y), dtype=bool)
    steps = Steps(x=x, classes=classes, time=np.full(len(y), 1e-3), host=y,
                  interval=np.full(len(y), 2e-3), overlapped=no, is_calibration=no,
                  window=no.copy())
    fits, report = fit_host(steps)
    # The per-sequence candidate, scored by hand: held-out error of each class, then their mean.
    test = holdout_mask(classes)
    by_seqs = fit_grouped(x[~test], y[~test], classes[~test], ("num_seqs",))
    errors = {name: [abs(by_seqs[name].linear(row[None])[0] - host) / host
                     for row, host in zip(x[test & (classes == name)], y[test & (classes == name)])]
              for name in np.unique(classes)}
    by_class = 100 * np.mean([np.mean(e) for e in errors.values()])
    by_row = 100 * np.mean(sum(errors.values(), []))
    assert by_class > 3 * by_row  # the decodes, near 0, are 32 of the 38 held out
    assert report["candidates"]["num_seqs"] == pytest.approx(by_class, abs=1e-3)
    assert report["chosen"] == "num_seqs, prefill_tokens"
    assert report["candidates"]["num_seqs, prefill_tokens"] == pytest.approx(0.0, abs=1e-6)
    tokens = FEATURES.index("prefill_tokens")
    assert fits["prefill_graph"].coef[tokens] == pytest.approx(1e-8, rel=1e-6)
    assert fits["prefill"].coef[tokens] == pytest.approx(2e-7, rel=1e-6)
    assert fits["decode_graph"].intercept == pytest.approx(2e-4, rel=1e-6)


def test_an_overlapped_step_is_priced_over_the_spread_of_its_host_time() -> None:
    """``interval(spread=...)``: host 1.0 ms at levels 0.5 and 1.5 of its mean against 1.2 ms of
    device time pays the mean of max(1.2, 0.5) and max(1.2, 1.5), 1.35 ms, not max(1.2, 1.0);
    without a spread, or where even the highest level stays under the device time, the max of
    the means; a sequential CUDA-graph step (device + host) ignores the spread, and
    ``intervals`` gives it to the overlapped steps only (not to a sequential eager step, parallel
    as it is)."""
    device, host, spread = 1.2e-3, 1.0e-3, (0.5, 1.5)
    assert interval(device, host, True, spread=spread) == pytest.approx(1.35e-3, rel=1e-12)
    assert interval(device, host, True) == pytest.approx(1.2e-3, rel=1e-12)
    assert interval(device, 0.5e-3, True, spread=spread) == pytest.approx(1.2e-3, rel=1e-12)
    assert interval(device, host, True, 1e-4, spread) == pytest.approx(1.45e-3, rel=1e-12)
    assert interval(device, host, False, spread=spread) == pytest.approx(2.2e-3, rel=1e-12)
    got = intervals(np.full(3, device), np.full(3, host), np.array([True, False, False]),
                    np.array(["decode_graph", "decode_graph", "prefill"]), spread=spread)
    assert got == pytest.approx([1.35e-3, 2.2e-3, 1.2e-3], rel=1e-12)


def test_the_host_spread_is_the_quantiles_of_measured_over_fitted_host_time_scaled_to_mean_1(
) -> None:
    """A run's overlapped decodes measured at 1x and 3x their fitted host time, half each:
    ``host_spread`` is SPREAD_QUANTILES levels, half 0.5 and half 1.5 (scaled to mean 1, so
    the fit stays the mean). The rarer class (wild ratios) and the sequential steps do not
    count; too few overlapped steps give none."""
    n = 64
    predicted = np.full(n + 20, 1e-3)
    ratio = np.concatenate([np.tile([1.0, 3.0], n // 2), np.full(10, 9.0), np.full(10, 0.1)])
    classes = ["decode_graph"] * n + ["prefill"] * 10 + ["decode_graph"] * 10
    launched = [True] * (n + 10) + [False] * 10
    run = _steps(classes, [1.0] * (n + 20), (ratio * predicted).tolist(), overlapped=launched)
    spread = host_spread(run, predicted)
    assert len(spread) == SPREAD_QUANTILES
    assert spread == pytest.approx((0.5,) * 8 + (1.5,) * 8, rel=1e-12)
    assert np.mean(spread) == pytest.approx(1.0, rel=1e-12)
    few = run.rows(np.arange(len(classes)) >= n - 8)
    assert host_spread(few, predicted[n - 8:]) == ()


def test_a_mixed_step_from_a_cuda_graph_is_its_own_class_and_never_has_the_eager_floor() -> None:
    """Graph or eager comes from the step: a graph mixed step is ``mixed_graph``, priced by the
    graph prefill fit where there is one, by the eager mixed fit's floor-free form otherwise."""
    assert step_class("mixed", True) == "mixed_graph"
    assert step_class("mixed", False) == "mixed"
    zero = (0.0,) * len(FEATURES)
    graph_prefill = LinearFit(1e-3, zero, (), 10)
    prefill = LinearFit(2e-3, zero, (), 10, floor=0.01)
    assert class_fit({"prefill_graph": graph_prefill, "prefill": prefill},
                     "mixed_graph") is graph_prefill
    assert class_fit({"prefill": prefill}, "mixed_graph").intercept == prefill.intercept


def test_the_ablation_switches_each_mechanism_off_once_and_sums_misses() -> None:
    variants = ablation_variants(CostOptions(profile_mode="profile"), with_profile=True)
    assert set(variants) == {"all mechanisms", "no profile", "profile_mode=blend",
                             "profile_mode=pooled", *(f"{s}=off" for s in SWITCHES),
                             *(f"{s}=on" for s in OPT_IN)}
    assert variants["shared_kv=on"].shared_kv and not variants["all mechanisms"].shared_kv
    assert variants["no profile"] is None
    assert not variants["overlap=off"].overlap and variants["overlap=off"].engine_host
    targets = {"makespan_s": 0.03, "ttft_mean_s": 0.10}
    rows = [{"kind": "prediction", "status": "ok", "makespan_s": 0.05, "ttft_mean_s": -0.02},
            {"kind": "prediction", "status": "ok", "makespan_s": -0.01, "ttft_mean_s": 0.2},
            {"kind": "spread", "status": "ok", "makespan_s": 0.5, "ttft_mean_s": 0.5}]
    summary = ablation_summary(rows, targets)
    assert summary["cells"] == 2 and summary["misses"] == 2
    assert summary["makespan_s"] == pytest.approx(0.03)
    assert "| x | 3.0% | 11.0% | 2 of 4 |" in ablation_markdown({"x": summary}, targets)


def test_step_errors_price_a_recording_by_the_model_fitted_on_it() -> None:
    """A law-timed recording priced step by step by its own model: per class the recorded and
    predicted sums agree to a few percent, and no step is a stall."""
    from engine.config import Config
    from replay.whatif.cost.model import CostModel
    from replay.whatif.matrix_study import step_errors, step_errors_markdown
    from replay.whatif.synthetic import HostLaw, StepLaw, record_workload
    from replay.workloads.builtin import reference_workload

    config = Config(num_kvcache_blocks=2000, max_num_seqs=32)
    events = record_workload(config, reference_workload()[:32], StepLaw(noise=0.01),
                             host=HostLaw())
    report = step_errors(CostModel.fit(events), events)
    assert report["classes"] and report["idle_s"] == pytest.approx(0.0, abs=1e-6)
    for row in report["classes"].values():
        recorded, predicted = row["interval_s"]
        assert row["stalls"] == 0 and predicted == pytest.approx(recorded, rel=0.05)
    assert "idle between steps" in step_errors_markdown({"cell": report})


def test_repeated_recordings_of_a_cell_are_named_so_that_the_matrix_states_their_spread() -> None:
    """``--repeat 3`` names CELL, CELL-r2, CELL-r3; ``spread_row`` labels them all."""
    import sys
    from pathlib import Path

    from replay.whatif.fidelity import spread_row

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from benchmarks.matrix import recording_names

    names = recording_names("chat-chunked-512", 3)
    assert names == ["chat-chunked-512", "chat-chunked-512-r2", "chat-chunked-512-r3"]
    summary = {"makespan_s": 10.0, "throughput_tok_s": 100.0, "ttft_mean_s": 1.0,
               "ttft_p50_s": 1.0, "ttft_p99_s": 2.0, "tpot_mean_s": 0.01, "tpot_p50_s": 0.01,
               "tpot_p99_s": 0.02}
    row = spread_row([summary, {**summary, "makespan_s": 10.5}, summary], names)
    assert row["target"] == " / ".join(names) and row["makespan_s"] == pytest.approx(0.05)
