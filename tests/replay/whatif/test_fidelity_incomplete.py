"""Fidelity tables and the validation matrix refuse or flag an incomplete (killed) recording:
its figures cover a prefix of the run, so errors against it (or a model fitted as if it were
the whole run) would be wrong without saying so."""

from __future__ import annotations

import shutil

import pytest

from benchmarks.matrix import main as matrix_main
from engine.config import Config
from engine.errors import ReplayLLMError
from replay.whatif.fidelity import fidelity, fidelity_markdown, matrix_markdown, matrix_rows
from replay.whatif.synthetic import StepLaw, record_workload
from replay.workloads.builtin import reference_workload
from replay.workloads.request import Request

CONFIG_A = Config(num_kvcache_blocks=60, kvcache_block_size=32, max_num_seqs=16)
CONFIG_B = Config(num_kvcache_blocks=30, kvcache_block_size=32, max_num_seqs=8)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two complete recordings of one short workload, and ``b`` killed after its first
    segment (no summary.json, later markers gone)."""
    root = tmp_path_factory.mktemp("fidelity-incomplete")
    requests = [Request(r.prompt[:300], min(r.max_tokens, 120))
                for r in reference_workload(num_seqs=16)]
    out = {}
    for name, config in (("a", CONFIG_A), ("b", CONFIG_B)):
        out[name] = str(root / name)
        record_workload(config, requests, StepLaw(), trace_dir=out[name], seed=len(out))
    killed = root / "killed"
    shutil.copytree(out["b"], killed)
    (killed / "summary.json").unlink()
    for marker in sorted((killed / "_commits").glob("seg-*.json"))[1:]:
        marker.unlink()
    out["killed"] = str(killed)
    return out


def test_matrix_flags_an_incomplete_target_in_its_row(traces) -> None:
    """It was predicted and compared with its prefix's figures (a makespan error of hundreds of
    percent, reported as the model's)."""
    rows = matrix_rows([traces["b"], traces["killed"]], traces["a"])
    ok, killed = rows
    assert ok["status"] == "ok" and "makespan_s" in ok
    assert killed["status"] == "incomplete recording (committed through step 255): not compared"
    assert "makespan_s" not in killed
    assert "| killed | incomplete recording" in matrix_markdown(rows)


def test_matrix_refuses_an_incomplete_source(traces) -> None:
    with pytest.raises(ReplayLLMError, match=r"source .*killed is an incomplete recording "
                                             r"\(committed through step 255\)"):
        matrix_rows([traces["a"]], traces["killed"])


def test_matrix_command_says_so_in_one_line(traces, tmp_path, capsys) -> None:
    cells = tmp_path / "cells"
    cells.mkdir()
    shutil.copytree(traces["b"], cells / "reference-default")
    shutil.copytree(traces["killed"], cells / "reference-constrained")
    assert matrix_main(["fidelity", str(cells), "--source", traces["a"]]) == 0
    out = capsys.readouterr().out
    assert "| reference-constrained | incomplete recording (committed through step 255)" in out
    for command in ("fidelity", "steps"):
        assert matrix_main([command, str(cells), "--source", traces["killed"]]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is an incomplete recording" in err


def test_fidelity_flags_pairs_with_an_incomplete_recording(traces) -> None:
    rows = fidelity([traces["a"], traces["killed"]])
    assert [r["status"] for r in rows] == [
        f"{traces['killed']}: incomplete recording (committed through step 255): not compared"
    ] * 2
    assert fidelity_markdown(rows).count("not compared") == 2
