"""A ``--grid`` (``tune --space``) value given twice is refused: ``--grid max_num_seqs=1,01``
ran two variants of one name, two summary.parquet rows and steps/requests rows tagged alike
that no reader could tell apart (``tune`` searched the configuration twice)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli import SAMPLE, message_lines, run_cli


@pytest.mark.parametrize(("command", "option", "values", "twice"), [
    ("whatif", "--grid", "max_num_seqs=1,01", "1"),
    ("whatif", "--grid", "policy=chunked,prefill_first,chunked", "chunked"),
    ("tune", "--space", "enable_prefix_caching=true,True", "True"),
])
def test_a_value_given_twice_is_one_line(tmp_path: Path, command: str, option: str,
                                         values: str, twice: str) -> None:
    extra = ["--slo", "ttft_p99=1"] if command == "tune" else []
    code, text, err = run_cli([command, str(SAMPLE), option, values, "--out",
                               str(tmp_path / "o"), "--no-plots", "--jobs", "1", *extra])
    assert code == 2
    (line,) = message_lines(err)
    key = values.partition("=")[0]
    assert line.endswith(f"{option} {key}: the value {twice} is given twice (in {values!r})")
    assert text == "" and not (tmp_path / "o").exists()


def test_distinct_values_still_run(tmp_path: Path) -> None:
    code, text, err = run_cli(["whatif", str(SAMPLE), "--grid", "max_num_seqs=1,2", "--out",
                               str(tmp_path / "o"), "--no-plots", "--jobs", "1"])
    assert code == 0, err
    names = [line.split()[0] for line in text.splitlines() if line.startswith("max_num_seqs=")]
    assert names == ["max_num_seqs=1", "max_num_seqs=2"]
