"""``whatif TRACE --compare LOADGEN_RESULT`` with plots on (the default): the client's row has
figures but no steps or requests table, and the plotter took every row of status ``ok``, so the
run printed its table, then died with ``KeyError: 'steps'`` (a traceback, no outputs written)."""

from __future__ import annotations

from _cli import run_cli

from engine.config import Config
from replay.loadgen.answer import Measured
from replay.loadgen.result import requests_frame, summarize, write_result
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request


def test_compare_with_a_loadgen_result_draws_the_plots_of_the_runs_with_steps(tmp_path) -> None:
    trace = str(tmp_path / "t")
    requests = [Request(r.prompt[:200], min(r.max_tokens, 40))
                for r in reference_workload(num_seqs=6)]
    record_workload(Config(num_kvcache_blocks=40, kvcache_block_size=32, max_num_seqs=4),
                    requests, StepLaw(), trace_dir=trace, seed=3)
    measured = [Measured(i, len(r.prompt), r.max_tokens, 0.1 * i, 0.1 * i, 0.1 * i + 0.05,
                         0.1 * i + 1.0, r.max_tokens, len(r.prompt), [0.1 * i + 0.05,
                         0.1 * i + 1.0], "length", token_source="usage", done=True)
                for i, r in enumerate(requests)]
    frame = requests_frame(measured)
    result = write_result(tmp_path / "r.parquet", frame, summarize(frame, 2.5), {"url": "u"})
    out = tmp_path / "w"
    code, text, err = run_cli(["whatif", trace, "--compare", str(result), "--out", str(out)])
    assert code == 0, err
    assert "Traceback" not in err and "KeyError" not in err
    assert (out / "summary.parquet").exists()
    assert sorted(p.name for p in out.glob("*.png")), "the recorded and predicted runs' plots"
