"""The H100 matrix of the engine with a prompt's ids as one int32 array (traces/matrix-s35-h100
and its three-recording spread, session 35): what the what-if predicts of it, and where a
process's first Azure recording loses time (docs/BENCHMARKS.md 7af)."""

from __future__ import annotations

import numpy as np

from benchmarks.gc_pauses import STALL_S, host_stalls
from replay.recorded import from_trace
from replay.whatif.fidelity import MATRIX_TARGETS, matrix_rows
from tracing.reader import read_trace

MATRIX = "traces/matrix-s35-h100"
SPREAD = "traces/matrix-s35-h100-spread"


def test_the_configurations_and_azure_meet_every_target_from_their_own_calls_source() -> None:
    """From the call's own reference-default and the H100 profile taken in the same session,
    the constrained pool, chunked prefill and max_num_seqs cells decide identically, and they,
    chat and bursty under chunked prefill and Azure's burst of long prompts (whose p50 TTFT
    missed on every H200 matrix since session 14) meet every target (5 of 117 missed over the
    whole matrix, the conversation cells' TPOT and bursty's p50 TPOT)."""
    identical = ("reference-constrained", "reference-chunked-2048", "reference-mns128")
    cells = (*identical, "chat-chunked-512", "bursty-chunked-2048", "azure-code-default")
    rows = matrix_rows([f"{MATRIX}/{cell}" for cell in cells], f"{MATRIX}/reference-default",
                       "traces/profiles/h100-qwen3-0.6b-s35.profile.json")
    predictions = {row["target"]: row for row in rows if row["kind"] == "prediction"}
    assert set(predictions) == set(cells)
    for cell in identical:
        assert predictions[cell]["decisions_identical"] is True, cell
    for cell, row in predictions.items():
        for metric, bound in MATRIX_TARGETS.items():
            assert abs(row[metric]) <= bound, (cell, metric, row[metric])


def _decode_stalls(trace: str) -> list[tuple[int, int, bool]]:
    """Each decode step whose host exceeds the decode median by ``STALL_S`` (the stall rule of
    ``host_stalls``, whose counts give no steps): (step, padded batch,
    whether the recording used that padded batch for the first time at or just before it)."""
    steps = from_trace(read_trace(trace)).tables["model_step"]
    stalls = host_stalls(steps, 0.0, {})
    assert stalls["stalls_by_class"]["prefill"][0] == 0, stalls  # the int32 prompt path
    host = np.asarray(steps["host_s"], float)
    kind, padded = np.asarray(steps["kind"]), np.asarray(steps["padded_batch_size"])
    decode = kind == "decode"
    median = np.median(host[decode])
    first_use: dict[int, int] = {}
    for i in np.flatnonzero(decode):
        first_use.setdefault(int(padded[i]), i)
    return [(int(i), int(padded[i]), first_use[int(padded[i])] >= i - 2)
            for i in np.flatnonzero(decode & (host > median + STALL_S))]


def test_only_a_processs_first_azure_recording_stalls_at_decode_batches_new_to_it() -> None:
    """The three Azure recordings of one process: the first has 12 decode steps whose host
    waits 9-33 ms (about one step of the device), each at a padded batch (80-288 rows) the
    recording used for the first time at that step or two steps before; the second and third
    have none, and no recording has a prefill stall (session 33's H200 Azure had four). So the
    stall is a first use in the process (the warm-up engines run decodes of at most 64 rows),
    not the engine's per-step work; the probe for its cause is tools/probe_first_stalls.py
    --cell azure-code-default (docs/gpu-notes.md, session 35)."""
    first = _decode_stalls(f"{SPREAD}/azure-code-default")
    assert len(first) == 12
    assert all(new for _, _, new in first), first
    assert {padded for _, padded, _ in first} <= set(range(80, 289, 16)), first
    for repeat in ("r2", "r3"):
        assert _decode_stalls(f"{SPREAD}/azure-code-default-{repeat}") == [], repeat
