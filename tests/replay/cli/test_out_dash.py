"""``--out -`` on a command that writes a file: one line, exit 2, nothing written.

Before: ``workload generate --out -`` wrote a file literally named ``-`` in the working
directory (and so did every other file output but ``export``, whose ``--out -`` is standard
output by design and stays so)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replay.cli.main import main as replayllm
from replay.cli.paths import (
    check_bench_json,
    check_profile_out,
    check_result_out,
    check_workload_out,
)
from tracing.outdir import OutputDirError


def test_workload_generate_to_dash_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    code = replayllm(["workload", "generate", "--num-requests", "3", "--out", "-"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "not to standard output; give a file name" in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("check", [check_workload_out, check_profile_out, check_bench_json,
                                   check_result_out])
def test_every_file_output_refuses_dash(check) -> None:
    with pytest.raises(OutputDirError, match="not to standard output"):
        check("-")
