"""A trace written by ``whatif --trace-out`` (a simulation, its header's ``simulated_from``)
given back to ``whatif`` as TRACE or ``--timing-from`` is named as such in a note: its step
times are an earlier prediction's, and as TRACE its ``recorded`` row is not a measurement (it
was taken for a recording in silence). A recording gets no such note."""

from __future__ import annotations

from pathlib import Path

from _cli import SAMPLE, TINY_REQUEST, run_cli, write_jsonl

NOTE = "is a simulated trace (of "


def test_a_simulated_trace_is_named_as_source_and_as_timing_source(tmp_path: Path) -> None:
    workload = write_jsonl(tmp_path / "w.jsonl", [{**TINY_REQUEST, "arrival_s": 0.01 * i}
                                                  for i in range(4)])
    simulated = tmp_path / "sim"
    code, text, _ = run_cli(["whatif", "--workload", str(workload), "--timing-from", str(SAMPLE),
                             "--trace-out", str(simulated), "--out", str(tmp_path / "o0"),
                             "--no-plots"])
    assert code == 0 and NOTE not in text, text  # SAMPLE is a recording
    code, text, _ = run_cli(["whatif", str(simulated), "--out", str(tmp_path / "o1"),
                             "--no-plots"])
    assert code == 0, text
    assert f"note: the source {simulated} {NOTE}{workload}, step-time model of {SAMPLE}), not " \
           "a recording: its step times and 'recorded' row are an earlier prediction's" in text
    for stream in ([], ["--stream"]):
        code, text, _ = run_cli(["whatif", "--workload", str(workload), "--timing-from",
                                 str(simulated), "--out", str(tmp_path / "o2"), "--no-plots",
                                 *stream])
        assert code == 0, text
        assert f"note: the timing source {simulated} {NOTE}" in text
        assert text.count(NOTE) == 1
