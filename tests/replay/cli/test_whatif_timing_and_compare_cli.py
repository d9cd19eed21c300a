"""Session 32 (what-if and tune): ``whatif TRACE --timing-from OTHER`` (plain, ``--grid``) and
``tune`` where OTHER ran another device and model than TRACE say so in one line, naming both,
instead of printing the recorded row beside predictions priced elsewhere without a word."""

from __future__ import annotations

import pandas as pd
from _cli import REPO, SAMPLE, run_cli

H200 = str(REPO / "traces" / "h200-reference")
H200_CHUNKED = str(REPO / "traces" / "h200-reference-chunked-2048")
NAMED = ("ran Qwen3ForCausalLM, 10M parameters, float32 on cpu;",
         "recorded Qwen3ForCausalLM, 596M parameters, bfloat16 on NVIDIA H200: another device "
         "and model")


def _timing_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("note: --timing-from")]


def test_whatif_names_a_timing_source_of_another_device_and_model(tmp_path) -> None:
    out = tmp_path / "w"
    code, text, err = run_cli(["whatif", H200, "--timing-from", str(SAMPLE), "--out", str(out),
                               "--no-plots"])
    assert code == 0, err
    (line,) = _timing_lines(text)
    assert all(part in line for part in NAMED)
    summary = pd.read_parquet(out / "summary.parquet").set_index("variant")
    assert "another device and model" in summary.loc["recorded", "notes"]
    code, text, err = run_cli(["whatif", H200, "--timing-from", str(SAMPLE), "--out", str(out),
                               "--no-plots", "--grid", "max_num_seqs=64,128", "--jobs", "1"])
    assert code == 0, err
    assert len(_timing_lines(text)) == 1


def test_tune_names_it_too_and_a_like_timing_source_gets_no_note(tmp_path) -> None:
    code, text, err = run_cli(["tune", H200, "--timing-from", str(SAMPLE), "--out",
                               str(tmp_path / "t"), "--no-plots", "--slo", "ttft_p99=1",
                               "--space", "max_num_seqs=64,128", "--jobs", "1"])
    assert code in (0, 1), err
    (line,) = _timing_lines(text)
    assert all(part in line for part in NAMED)
    code, text, err = run_cli(["whatif", H200, "--timing-from", H200_CHUNKED, "--out",
                               str(tmp_path / "w"), "--no-plots"])
    assert code == 0, err
    assert _timing_lines(text) == []


def test_compare_matches_client_rows_the_server_numbered_in_another_order(tmp_path) -> None:
    """``replayllm loadgen`` against ``replayllm serve``: a request sent a moment after another
    can reach the engine first, so the trace's ``seq_id`` order is not the workload's (seen: its
    requests 2 and 3, max_tokens 32 and 37, reached it as seq 3 and 2). With a killed SOURCE
    the client rows were taken by workload index: ``ran another workload`` (exit 2), or, with
    like max_tokens, another request's row. Now matched by prompt length and max_tokens."""
    import numpy as np
    from _cli import killed_copy

    from engine.config import Config
    from replay.loadgen.answer import Measured
    from replay.loadgen.result import requests_frame, summarize, write_result
    from replay.recorded import from_trace
    from replay.whatif.synthetic import StepLaw, record_workload
    from replay.workloads.builtin import reference_workload
    from replay.workloads.request import Request
    from tracing.reader import read_trace

    trace = str(tmp_path / "t")
    requests = [Request(r.prompt[:300], min(r.max_tokens, 120))
                for r in reference_workload(num_seqs=16)]
    record_workload(Config(num_kvcache_blocks=30, kvcache_block_size=32, max_num_seqs=8),
                    requests, StepLaw(), trace_dir=trace, seed=2)
    killed = killed_copy(trace, tmp_path / "killed", keep=1)
    recorded = from_trace(read_trace(killed))
    added = recorded.tables["request_added"]
    shapes = list(zip(np.asarray(added["prompt_len"]).tolist(),
                      np.asarray(added["max_tokens"]).tolist()))
    done = np.isin(np.asarray(added["seq_id"]), recorded.tables["request_finished"]["seq_id"])
    a = int(np.flatnonzero(done)[0])  # a finished request and one of another max_tokens
    b = next(i for i in range(len(shapes)) if shapes[i][1] != shapes[a][1])
    sent = list(shapes)
    sent[a], sent[b] = sent[b], sent[a]  # the client's index order: a and b swapped
    measured = [Measured(i, p, m, 0.1 * i, 0.1 * i, 0.1 * i + 0.05, 0.1 * i + 1.0, m, p,
                         [0.1 * i + 0.05, 0.1 * i + 1.0], "length", token_source="usage",
                         done=True) for i, (p, m) in enumerate(sent)]
    frame = requests_frame(measured)
    result = write_result(tmp_path / "r.parquet", frame, summarize(frame, 2.5), {"url": "u"})
    out = tmp_path / "w"
    code, text, err = run_cli(["whatif", killed, "--compare", str(result), "--no-plots",
                               "--out", str(out)])
    assert code == 0, err  # was 2: "ran another workload"
    rows = pd.read_parquet(out / "requests.parquet")
    client = rows[rows["variant"].str.startswith("client")]
    assert sorted(client["max_tokens"]) == sorted(m for (_, m), d in zip(shapes, done) if d)
    assert sorted(client["prompt_tokens"]) == sorted(p for (p, _), d in zip(shapes, done) if d)
