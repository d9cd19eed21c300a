"""``whatif --report FILE.html``: the page's numbers are the printed ones (no figure cut to four
digits in exponent form), and ``--compare``'s page holds what ``--compare`` printed."""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from engine.config import Config
from replay.cli.main import main
from replay.whatif.html_report import number
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request

REFERENCE = Path(__file__).parents[3] / "traces" / "h200-reference"  # 256 requests, 134k tokens


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> str:
    requests = [Request(r.prompt[:200], min(r.max_tokens, 60)) for r in reference_workload(12)]
    path = str(tmp_path_factory.mktemp("report") / "trace")
    record_workload(Config(num_kvcache_blocks=60, kvcache_block_size=32, max_num_seqs=16),
                    requests, StepLaw(), trace_dir=path, seed=1)
    return path


def _cells(page: Path, caption: str) -> pd.DataFrame:
    """The table under ``<h2>caption</h2>``, its cells as the page shows them (text)."""
    text = page.read_text()
    table = text[text.index(f"<h2>{caption}</h2>"):]
    table = table[:table.index("</table>")]
    header = re.findall(r"<th>(.*?)</th>", table)
    rows = [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", table[table.index("<tbody>"):], re.S)]
    return pd.DataFrame(rows, columns=header)


def test_number_keeps_whole_numbers_and_large_values() -> None:
    assert [number(v) for v in (133952.0, 27386.94, 4.8916, 0.0057412, 0.0, -3.0)] == [
        "133952", "27386.9", "4.892", "0.005741", "0", "-3"]
    assert number(math.nan) == "n/a" and number(math.inf) == "inf"


def test_report_numbers_are_the_printed_ones_with_a_variant_that_cannot_run(
        trace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A grid with a variant that cannot run (its row's NaN makes every metric column float):
    the page showed the recording's 27,387 tok/s as ``2.739e+04`` and its completion tokens
    (134k) as ``1.34e+05``, four digits where the printed table has all. Now each cell is the
    summary.parquet value, whole numbers in full."""
    page, out = tmp_path / "r.html", tmp_path / "out"
    assert main(["whatif", str(REFERENCE), "--grid", "num_kvcache_blocks=2,900", "--out",
                 str(out), "--report", str(page), "--no-plots", "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    assert "num_kvcache_blocks=2  cannot run" in printed
    shown = _cells(page, "summary")
    summary = pd.read_parquet(out / "summary.parquet")
    assert "e+" not in page.read_text()
    for column in ("requests", "completion_tokens", "steps", "throughput_tok_s", "makespan_s"):
        for cell, value in zip(shown[column], summary[column]):
            if math.isnan(value):
                assert cell == "n/a"
            elif float(value).is_integer():
                assert cell == str(int(value))
            else:
                assert math.isclose(float(cell), value, rel_tol=1e-3), (column, cell, value)
    # the printed tok/s of each row that ran is the page's, rounded as the table rounds it
    for label, value in zip(summary["variant"], summary["throughput_tok_s"]):
        if not math.isnan(value):
            assert re.search(rf"^{re.escape(label)}\s+\d+\s+{round(value)}\s", printed, re.M)


def test_compare_report_holds_the_comparison_and_the_verdict(
        trace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the page held the variants table and the compare table's raw fractions only;
    the printed comparison (errors in %) and the decision-stream verdict were missing."""
    page = tmp_path / "c.html"
    assert main(["whatif", trace, "--compare", trace, "--out", str(tmp_path / "out"),
                 "--report", str(page), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    verdict = next(line for line in printed.splitlines() if line.startswith("decision streams"))
    text = html.unescape(page.read_text())
    pre = text[text.index("<pre>"):text.index("</pre>")]
    assert verdict in pre
    table = printed[printed.index("metric "):printed.index(verdict)].rstrip("\n")
    assert table in pre and "+0.00%" in table
