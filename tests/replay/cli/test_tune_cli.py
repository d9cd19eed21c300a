"""``replayllm tune`` end to end on the committed H200 reference trace.

What these tests prove: the command reports that the recorded defaults miss the SLOs, prints
the best configuration as ``--set`` lines, writes tune.parquet, the Pareto plot and an HTML
page with both; bad input
(an unknown SLO metric, no SLO) is one line on stderr with exit status 2.
"""

from __future__ import annotations

import pandas as pd
import pytest

from replay.cli.main import main

REFERENCE = "traces/h200-reference-s4"


@pytest.mark.slow
def test_tune_cli_reports_best_set_lines_front_and_plot(tmp_path, capsys):
    out = tmp_path / "tune"
    status = main(["tune", REFERENCE, "--slo", "ttft_p99=0.5", "--slo", "tpot_p50=0.0055",
                   "--space", "max_num_seqs=128,256", "--jobs", "2", "--out", str(out),
                   "--report", str(tmp_path / "tune.html")])
    text = capsys.readouterr().out
    assert status == 0, text
    assert "as recorded: misses ttft_p99<=0.5s, tpot_p50<=0.0055s" in text
    assert "\n--set max_num_seqs=128\n" in text
    table = pd.read_parquet(out / "tune.parquet")
    assert list(table["configuration"]) == ["as recorded", "max_num_seqs=128",
                                            "max_num_seqs=256"]
    assert list(table["meets_slos"]) == [False, True, False]
    assert (out / "pareto.png").stat().st_size > 10_000
    page = (tmp_path / "tune.html").read_text()
    assert page.count("data:image/png;base64,") == 1 and "--set max_num_seqs=128" in page


@pytest.mark.parametrize("args, message", [
    (["--slo", "speed=1"], "--slo expects METRIC=SECONDS"),
    ([], "give at least one --slo"),
])
def test_tune_cli_bad_input_is_one_line(args, message, capsys, tmp_path):
    status = main(["tune", REFERENCE, "--space", "max_num_seqs=128", "--out", str(tmp_path),
                   *args])
    err = capsys.readouterr().err
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1
