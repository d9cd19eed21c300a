"""The validation matrix's table: every recorded cell predicted from one source."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.config import Config
from replay.whatif.fidelity import (
    MATRIX_TARGETS,
    SPREAD_CELLS,
    machine_spread_rows,
    matrix_markdown,
    matrix_rows,
)
from replay.whatif.synthetic import StepLaw, law_profile, record_workload
from replay.workloads.builtin import reference_workload
from tracing.reader import read_trace

SOURCE = Config(num_kvcache_blocks=2000, max_num_seqs=64)
DEVICE = Config(max_model_len=4096, max_num_seqs=512, max_num_batched_tokens=32768,
                num_kvcache_blocks=60000)


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Synthetic recordings: the reference three times (other noise seeds), a constrained pool,
    chunked prefill, and Poisson-like arrivals."""
    root = tmp_path_factory.mktemp("matrix")
    requests = reference_workload()[:48]
    law = StepLaw(noise=0.01)
    # Arrivals 5 ms apart queue for a few steps. At 20 ms apart each TTFT is one or two steps,
    # and its error is the phase of a 1%-noisy step clock (13-22% per request by noise seed,
    # whichever way the profile joins the fit), not the model's.
    arriving = [replace(r, arrival_s=0.005 * i) for i, r in enumerate(requests)]
    plan = {
        SPREAD_CELLS[0]: (SOURCE, requests, 0),
        SPREAD_CELLS[1]: (SOURCE, requests, 1),
        SPREAD_CELLS[2]: (SOURCE, requests, 2),
        "constrained": (SOURCE.replace(max_num_seqs=16, num_kvcache_blocks=300), requests, 0),
        "chunked": (SOURCE.replace(policy="chunked", max_num_batched_tokens=512), requests, 0),
        "arrivals": (SOURCE, arriving, 0),
    }
    out = {}
    for name, (config, reqs, seed) in plan.items():
        out[name] = str(root / name)
        record_workload(config, reqs, law, trace_dir=out[name], seed=seed)
    return out


def predictions(matrix: str, cells: tuple[str, ...], source: str,
                profile: str) -> dict[str, dict]:
    """The prediction row of each cell of ``traces/MATRIX`` from ``source`` and ``profile``."""
    rows = matrix_rows([f"traces/{matrix}/{cell}" for cell in cells], source, profile)
    return {row["target"]: row for row in rows if row["kind"] == "prediction"}


def assert_every_target(rows: dict[str, dict], identical: tuple[str, ...]) -> None:
    """Every row within every target; the ``identical`` cells' decisions identical."""
    for cell in identical:
        assert rows[cell]["decisions_identical"] is True, cell
    for cell, row in rows.items():
        for metric, bound in MATRIX_TARGETS.items():
            assert abs(row[metric]) <= bound, (cell, metric, row[metric])


def test_synthetic_cells_meet_the_targets_and_the_spread_row_follows(cells) -> None:
    """From one source (and a profile of the same law): every cell within its targets,
    decisions identical without arrivals, admissions counted with them, and the spread of the
    repeated cell last."""
    targets = list(cells.values())[1:]
    profile = law_profile(DEVICE, StepLaw(noise=0.0, flush_every=0))
    rows = matrix_rows(targets, cells[SPREAD_CELLS[0]], profile)
    predictions = {r["target"]: r for r in rows if r["kind"] == "prediction"}
    assert set(predictions) == {Path(t).name for t in targets}
    for row in predictions.values():
        assert row["status"] == "ok"
        for metric, target in MATRIX_TARGETS.items():
            # With arrivals the tail TTFT of 48 requests is one request's: not held to 20% here.
            if row["target"] == "arrivals" and metric == "ttft_p99_s":
                continue
            assert abs(row[metric]) <= target, (row["target"], metric, row[metric])
    assert predictions["constrained"]["decisions_identical"] is True
    assert predictions["chunked"]["decisions_identical"] is True
    assert predictions["arrivals"]["arrivals"] is True
    assert predictions["arrivals"]["admitted_elsewhere"] is not None
    # the spread row needs all three repeats among the targets
    assert rows[-1]["kind"] != "spread"
    rows = matrix_rows(list(cells.values()), cells[SPREAD_CELLS[0]])
    assert rows[-1]["kind"] == "spread" and 0 < abs(rows[-1]["tpot_p50_s"]) < 0.05
    table = matrix_markdown(rows)
    assert table.count("\n") == len(rows) + 1 and "run-to-run spread" in table


def test_the_committed_h200_traces_from_the_reference() -> None:
    """traces/h200-reference-s4 predicts itself and the constrained recording within the targets,
    with identical decisions (no arrivals)."""
    rows = matrix_rows(["traces/h200-reference-s4", "traces/h200-constrained"],
                       "traces/h200-reference-s4")
    for row in rows:
        assert row["decisions_identical"] is True
        for metric, target in MATRIX_TARGETS.items():
            assert abs(row[metric]) <= target, (row["target"], metric, row[metric])


def test_a_cell_on_a_slower_host_priced_by_its_own_calibration() -> None:
    """A committed cell recorded on a slower host (traces/matrix-call9): its TTFT error from
    the reference is smaller priced on its own host (``target_host``, the ratio in the table's
    host column) than on the source's; and the spread between the two device calls' recordings
    of the cell reads as a table row with the two calibrations' host ratio."""
    cell = "traces/matrix-call9/reference-default"
    plain, = matrix_rows([cell], "traces/h200-reference-s4")
    host, = matrix_rows([cell], "traces/h200-reference-s4", target_host=True)
    assert plain["host_ratio"] is None and host["host_ratio"] > 1.5
    assert host["ttft_mean_s"] > plain["ttft_mean_s"]  # slower, so nearer to the recording
    assert abs(host["ttft_mean_s"]) < 0.75 * abs(plain["ttft_mean_s"])
    assert f"x{host['host_ratio']:.2f}" in matrix_markdown([host])
    assert "host (own calibration)" not in matrix_markdown([plain])
    spread, = machine_spread_rows([("traces/matrix/reference-default", cell)])
    assert spread["host_ratio"] > 1.5 and spread["ttft_mean_s"] > 0
    assert spread["decisions_identical"] is not None
    table = matrix_markdown([spread], host_label="host (calibrations)")
    assert "host (calibrations)" in table and f"x{spread['host_ratio']:.2f}" in table


def test_the_long_prompt_cells_priced_by_a_profile_of_their_own_call() -> None:
    """traces/matrix-s16b (one device call, recorded after this model was designed: a held-out
    matrix): predicted from that call's reference and profile, the bursty cell meets every TTFT
    and TPOT target and mooncake every TTFT target; the Azure cell's TTFT, off by far from the
    reference alone (its prefills are ~550-token prompts), is priced closer with the profile
    (docs/BENCHMARKS.md 7m)."""
    from replay.whatif.cost.options import CostOptions

    directory = Path("traces/matrix-s16b")
    names = ("bursty-default", "mooncake-default", "azure-code-default")
    targets = [str(directory / name) for name in names]
    source = str(directory / "reference-default-3")
    profile = "traces/profiles/h200-qwen3-0.6b-s16b.profile.json"
    rows = {row["target"]: row for row in matrix_rows(targets, source, profile,
                                                      CostOptions(profile_mode="pooled"))}
    ttft = [m for m in MATRIX_TARGETS if m.startswith("ttft")]
    for name, metrics in (("bursty-default", [*ttft, "tpot_mean_s", "tpot_p50_s", "tpot_p99_s"]),
                          ("mooncake-default", ttft)):
        for metric in metrics:
            assert abs(rows[name][metric]) <= MATRIX_TARGETS[metric], (name, metric,
                                                                        rows[name][metric])
    azure, = matrix_rows(targets[2:], source)
    assert abs(azure["ttft_mean_s"]) > 0.3
    assert abs(rows["azure-code-default"]["ttft_mean_s"]) < abs(azure["ttft_mean_s"]) / 2


@pytest.mark.parametrize("matrix", ["matrix-s16", "matrix-s16b"])
def test_small_and_long_graph_prefills_are_priced_on_two_machines(matrix: str) -> None:
    """The graph prefills of six cells of a fixed-driver matrix (one prompt of 100-1,200 new
    tokens over a cached prefix in chat and conversation, 4k-14k-token prompts in bursty,
    mooncake and Azure, preempted re-prefills in the constrained pool), priced from the call's
    reference recording (nine 16k-token prefills) and profile: device time within 4% (the
    constrained pool's re-prefills within 8%: +6.4-6.7%) where an earlier model priced the
    cached-prefix ones +34-36% (prefill attention counted causally, the roofline fitted by
    relative error) and the source's own -6% (its run steps left out as a warm-up window and
    outweighed by its start-up's one-prompt rows: BENCHMARKS 7q), host time within 35% where
    it priced them -27% to -51% (the engine's work per prompt token, each class's own token
    slope: BENCHMARKS 7m), and the model's description says so."""
    from replay.recorded import from_trace
    from replay.whatif.cost.model import CostModel
    from replay.whatif.cost.options import CostOptions
    from replay.whatif.matrix_study import step_errors
    from tracing.reader import read_trace

    directory = Path("traces") / matrix
    model = CostModel.fit(from_trace(read_trace(str(directory / "reference-default-3"))),
                          profile=f"traces/profiles/h200-qwen3-0.6b-{matrix[7:]}.profile.json",
                          options=CostOptions(profile_mode="pooled"))
    text = model.describe()  # what priced the host: each prefill class's own token slope
    assert "+ a per-token slope per class" in text
    assert any(line.strip().startswith("prefill_graph") and "ns x prefill_tokens" in line
               for line in text.splitlines())
    assert "the engine's own work around a step" in text
    for cell in ("reference-default-3", "chat-default", "conversation-default",
                 "azure-code-default", "mooncake-default", "bursty-default",
                 "reference-constrained"):
        errors = step_errors(model, from_trace(read_trace(str(directory / cell))))
        prefills = errors["classes"]["prefill_graph sequential"]
        device_bound = 0.08 if cell == "reference-constrained" else 0.04
        for what, bound in (("device_s", device_bound), ("host_s", 0.35)):
            recorded, predicted = prefills[what]
            assert abs(predicted / recorded - 1) <= bound, (cell, what, recorded, predicted)


@pytest.mark.parametrize(("target", "source"), [("matrix-s18b", "matrix-s18"),
                                                ("matrix-s18", "matrix-s18b"),
                                                ("matrix-s19", "matrix-s18"),
                                                ("matrix-s20", "matrix-s19")])
def test_a_call_predicted_from_another_calls_source_and_profile(target: str, source: str) -> None:
    """traces/matrix-s18 and -s18b: one engine, two calls on two machines (and -s19, a third,
    its engine with session 18's start-up warm-ups and 256-step segments). From one call's
    reference and profile, the other call's constrained pool and chunked prefill decide
    identically with TPOT (and the chunked cell's throughput) within target, and its bursty
    long-prompt cells meet every TTFT and TPOT target (docs/BENCHMARKS.md 7p, 7q)."""
    cells = ("reference-constrained", "reference-chunked-2048", "bursty-default",
             "bursty-chunked-2048")
    rows = predictions(target, cells, f"traces/{source}/reference-default-3",
                       f"traces/profiles/h200-qwen3-0.6b-{source[7:]}.profile.json")
    # The constrained pool's throughput misses by 3.9% one way (its 153 preemptions' recompute
    # prefills): its TPOT is held here, not its throughput.
    for cell, metrics in ((cells[0], ("tpot_mean_s", "tpot_p50_s")),
                          (cells[1], ("throughput_tok_s", "makespan_s", "tpot_mean_s",
                                      "tpot_p50_s"))):
        assert rows[cell]["decisions_identical"] is True
        for metric in metrics:
            assert abs(rows[cell][metric]) <= MATRIX_TARGETS[metric], (cell, metric,
                                                                       rows[cell][metric])
    for cell in cells[2:]:
        assert rows[cell]["arrivals"] is True
        for metric in MATRIX_TARGETS:
            if metric.startswith(("ttft", "tpot")):
                assert abs(rows[cell][metric]) <= MATRIX_TARGETS[metric], (cell, metric,
                                                                           rows[cell][metric])


def test_a_long_row_among_few_decodes_is_priced_from_another_call() -> None:
    """traces/matrix-s20 was recorded by the decode kernel that launches every split of a row
    together (the row on the grid's slowest axis: gpu-notes session 20). Its Mooncake and Azure
    cells, whose decodes hold one 4-8k-token row among few, are predicted from matrix-s19's
    source and profile (another call and machine) with TPOT mean and p50 within 5%; under the
    split-slowest grid, from s18's, they read -10..-13% (docs/BENCHMARKS.md 7q, 7r)."""
    cells = ("mooncake-default", "azure-code-default")
    rows = predictions("matrix-s20", cells, "traces/matrix-s19/reference-default-3",
                       "traces/profiles/h200-qwen3-0.6b-s19.profile.json")
    for cell in cells:
        for metric in ("tpot_mean_s", "tpot_p50_s"):
            assert abs(rows[cell][metric]) <= MATRIX_TARGETS[metric], (cell, metric,
                                                                       rows[cell][metric])


def test_the_issues_one_source_predicts_another_calls_cells() -> None:
    """Issue 16's one source, traces/h200-reference (re-recorded by today's engine in session 21)
    with the profile of the same call, predicts matrix-s20 (another call and machine): its
    constrained pool and max_num_seqs 128 decide identically, and those cells and the chat and
    conversation traffic under a constrained pool meet every target (docs/BENCHMARKS.md 7s:
    16 of 144 missed over the whole matrix; from the session-4 recording, 47)."""
    cells = ("reference-constrained", "reference-mns128", "chat-constrained",
             "conversation-constrained")
    rows = predictions("matrix-s20", cells, "traces/h200-reference",
                       "traces/profiles/h200-qwen3-0.6b-s21.profile.json")
    assert_every_target(rows, identical=cells[:2])


def _longest_unexplained_wait_s(trace: str) -> float:
    """The most a step's interval exceeds its host work (or device time, the larger) plus the
    driver's time: a wait that none of them explains."""
    from replay.recorded import from_trace
    from tracing.reader import read_trace

    steps = from_trace(read_trace(trace)).tables["model_step"]
    wall = np.asarray(steps["wall_time_s"], float)
    busy = np.maximum(np.asarray(steps["duration_s"], float), np.asarray(steps["host_s"], float))
    return float(np.max(np.diff(wall) - busy[1:] - np.asarray(steps["outside_s"], float)[1:]))


def test_a_matrix_recorded_with_the_heap_frozen_has_no_chat_stall() -> None:
    """traces/matrix-s22-h100 was recorded with the start-up heap frozen out of the collector's
    full passes (``freeze_gc_heap``, gpu-notes session 22): no step of its chat cells (loaded
    without a pause) waits 20 ms beyond its host, device and driver time, where matrix-s20's
    chat-chunked-512 waited 148 ms once."""
    for cell in ("chat-default", "chat-constrained", "chat-chunked-512"):
        assert _longest_unexplained_wait_s(f"traces/matrix-s22-h100/{cell}") < 0.02, cell
    assert _longest_unexplained_wait_s("traces/matrix-s20/chat-chunked-512") > 0.1


def test_an_h100_matrix_is_predicted_from_its_own_calls_source_and_profile() -> None:
    """traces/matrix-s22-h100, the matrix on an H100 with its own call's reference recording and
    profile as the source: the constrained pool and chunked prefill decide identically, and the
    chat traffic (chunked included) and bursty long prompts meet every target (6 of 144 missed
    over the whole matrix: docs/BENCHMARKS.md 7t)."""
    cells = ("reference-constrained", "reference-chunked-2048", "chat-constrained",
             "chat-chunked-512", "bursty-default")
    rows = predictions("matrix-s22-h100", cells, "traces/matrix-s22-h100/reference-default-3",
                       "traces/profiles/h100-qwen3-0.6b-s22.profile.json")
    assert_every_target(rows, identical=cells[:2])
    assert all(row["device_note"] is None for row in rows.values())


def test_a_cell_recorded_on_another_device_than_the_source_says_so() -> None:
    """The H100 matrix predicted from the H200's source: the table says which device each side
    ran on (the prediction prices the H200's), so a reader does not take the gap for an error
    of the model."""
    from replay.whatif.fidelity import matrix_markdown, matrix_rows

    rows = matrix_rows(["traces/matrix-s22-h100/reference-constrained"],
                       "traces/h200-reference")
    note = rows[0]["device_note"]
    assert "NVIDIA H100 80GB HBM3" in note and "NVIDIA H200" in note
    assert "note: recorded on NVIDIA H100 80GB HBM3" in matrix_markdown(rows)


def test_a_second_h100_matrix_is_predicted_from_the_first_ones_source() -> None:
    """traces/matrix-s23-h100 (another H100 machine, another call) predicted from session 22's
    H100 source and profile: the constrained pool and chunked prefill decide identically and
    meet every target (12 of 144 missed over the whole matrix: docs/BENCHMARKS.md 7v), and no
    chat step waits 20 ms beyond its host, device and driver time."""
    cells = ("reference-constrained", "reference-chunked-2048")
    rows = predictions("matrix-s23-h100", cells, "traces/matrix-s22-h100/reference-default-3",
                       "traces/profiles/h100-qwen3-0.6b-s22.profile.json")
    assert_every_target(rows, identical=cells)
    for cell in ("chat-default", "chat-constrained", "chat-chunked-512"):
        assert _longest_unexplained_wait_s(f"traces/matrix-s23-h100/{cell}") < 0.02, cell


def test_the_decode_prologue_engine_is_predicted_from_an_older_engines_source() -> None:
    """traces/matrix-s28-h100 (session 27's engine: QK-norm, RoPE and the K/V store inside the
    decode attention kernel; a fourth H100) predicted from session 22's H100 source and profile:
    the constrained pool and chunked prefill decide identically and, with Azure's arrivals,
    meet every target (17 of 144 missed over the whole matrix: docs/BENCHMARKS.md 7y)."""
    identical = ("reference-constrained", "reference-chunked-2048")
    rows = predictions("matrix-s28-h100", (*identical, "azure-code-default"),
                       "traces/matrix-s22-h100/reference-default-3",
                       "traces/profiles/h100-qwen3-0.6b-s22.profile.json")
    assert_every_target(rows, identical=identical)


def test_the_one_copy_staging_engine_meets_the_targets_from_its_own_call() -> None:
    """traces/matrix-s30-h100 (session 28's one staging copy a step; a seventh H100) from its
    own call's reference-default-3 and profile: the constrained pool and chunked prefill decide
    identically, and chat, bursty and Mooncake traffic meet every target (8 of 144 missed over
    the whole matrix, the conversation cells' TPOT and Azure's: docs/BENCHMARKS.md 7aa)."""
    identical = ("reference-constrained", "reference-chunked-2048")
    rows = predictions("matrix-s30-h100",
                       (*identical, "chat-default", "bursty-default", "mooncake-default"),
                       "traces/matrix-s30-h100/reference-default-3",
                       "traces/profiles/h100-qwen3-0.6b-s30.profile.json")
    assert_every_target(rows, identical=identical)


@pytest.mark.parametrize(("matrix", "ratio"), [("matrix-s28-h100", (1.5, 2.5)),
                                               ("matrix-s30-h100", (0.85, 1.15))])
def test_a_few_row_decodes_host_is_one_level_across_families_in_the_s30_matrix(
        matrix: str, ratio: tuple[float, float]) -> None:
    """The host work of a 1-3-row graph decode, reference-mns128's tail against chat-default's
    (the same rows and context per row): 1.02 against 0.55 ms in matrix-s28-h100, 0.51 against
    0.51 in matrix-s30-h100 (the next engine, one staging copy a step, on another host; which of
    the two closed the gap is not yet measured), so that call's reference source prices light
    traffic's host as it is recorded (docs/BENCHMARKS.md 7aa)."""
    def few_row_host(cell: str) -> float:
        steps = read_trace(f"traces/{matrix}/{cell}").df("model_step")
        few = steps[(steps.kind == "decode") & steps.graph_used & (steps.num_seqs <= 3)]
        return float(few.host_s.median())

    low, high = ratio
    assert low <= few_row_host("reference-mns128") / few_row_host("chat-default") <= high


H100_SOURCES = {"s22": ("traces/matrix-s22-h100/reference-default-3",
                        "traces/profiles/h100-qwen3-0.6b-s22.profile.json"),
                "s28": ("traces/matrix-s28-h100/reference-default-3",
                        "traces/profiles/h100-qwen3-0.6b-s28.profile.json")}


@pytest.mark.parametrize(("matrix", "source", "p99_ttft", "steady"), [
    ("matrix-s24-chat", "s22", (0.2, 1.0), ("throughput_tok_s",)),
    ("matrix-s28-chat", "s28", (0.05, 0.2),
     ("throughput_tok_s", "ttft_mean_s", "tpot_mean_s", "tpot_p99_s")),
    ("matrix-s28-chat-b", "s28", (0.0, 0.05),
     ("throughput_tok_s", "ttft_mean_s", "tpot_mean_s", "tpot_p99_s")),
])
def test_one_chat_cell_recorded_three_times_spreads_as_its_host_lets_it(
        matrix: str, source: str, p99_ttft: tuple[float, float], steady: tuple[str, ...]) -> None:
    """chat-default three times in one process on each of three H100 hosts: the table's spread
    row shows its p99 TTFT moving by 37% between recordings on matrix-s24-chat's host (past its
    20% target), 10% and 2% on matrix-s28-chat's and -chat-b's, while the ``steady`` metrics
    hold within 3% (docs/BENCHMARKS.md 7v, 7y). How far a chat cell's tail moves between
    recordings is the host's."""
    from replay.whatif.fidelity import matrix_rows

    rows = matrix_rows([f"traces/{matrix}/{c}" for c in
                        ("chat-default", "chat-default-r2", "chat-default-r3")],
                       *H100_SOURCES[source])
    spread = [row for row in rows if row["kind"] == "spread"]
    assert len(spread) == 1
    low, high = p99_ttft
    assert low <= abs(spread[0]["ttft_p99_s"]) < high
    for metric in steady:
        assert abs(spread[0][metric]) < 0.03, metric
