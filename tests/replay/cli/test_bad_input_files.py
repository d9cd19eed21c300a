"""Damaged input files through the CLI: ``whatif --profile``, ``--timing-from MODEL.json`` and
``--compare RESULT`` each give one line naming the file and the field and exit 2, never a
traceback or a silent exit 0. The loaders check (``load_profile``, ``CostModel.load``,
``read_result``); the CLI relies on them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from _cli import REPO, SAMPLE, one_error, run_cli

from replay.loadgen.result import METADATA_KEY

PROFILE = REPO / "traces" / "profiles" / "h100-qwen3-0.6b-s22.profile.json"


def _whatif(tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(["whatif", str(SAMPLE), "--no-plots", "--jobs", "1",
                    "--out", str(tmp_path / "o"), *extra])


def test_a_profile_row_field_of_the_wrong_type(tmp_path: Path) -> None:
    """A profile row whose ``prefix_groups`` is text (was: a ValueError traceback in the fit),
    alone or pooled with a good profile."""
    data = json.loads(PROFILE.read_text())
    data["rows"][0]["prefix_groups"] = "two"
    bad = tmp_path / "bad.profile.json"
    bad.write_text(json.dumps(data))
    for spec in (str(bad), f"{PROFILE},{bad}"):
        code, _, err = _whatif(tmp_path, "--profile", spec)
        assert code == 2, err
        one_error(err, "bad.profile.json", "profile row 0: prefix_groups")


def test_a_saved_model_with_a_wrong_field(tmp_path: Path) -> None:
    """A saved model whose ``coverage`` is a list (was: an AttributeError traceback from
    ``describe``) or whose fit lost a coefficient."""
    code, _, err = _whatif(tmp_path)
    assert code == 0, err
    saved = json.loads((tmp_path / "o" / "cost_model.json").read_text())
    for change, needle in (({"coverage": [1]}, "coverage must be a JSON object"),
                           ({"fits": {"decode": {"intercept": 0.0}}}, "fits.decode.coef")):
        bad = tmp_path / "bad-model.json"
        bad.write_text(json.dumps({**saved, **change}))
        code, _, err = _whatif(tmp_path, "--timing-from", str(bad))
        assert code == 2, err
        one_error(err, "bad-model.json", needle)


def test_a_damaged_loadgen_result(tmp_path: Path) -> None:
    """A result whose metadata is a list (was: a TypeError traceback) or that lacks the
    per-request columns (was: accepted, exit 0)."""
    frame = pd.DataFrame({"index": [0, 1], "error": ["", ""]})
    for name, meta, needle in (
            ("list.parquet", b"[1, 2]", "malformed loadgen metadata"),
            ("cols.parquet", json.dumps({"summary": {}, "run": {}}).encode(), "no arrival_s")):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        pq.write_table(table.replace_schema_metadata({METADATA_KEY: meta}), tmp_path / name)
        code, _, err = _whatif(tmp_path, "--compare", str(tmp_path / name))
        assert code == 2, err
        one_error(err, name, needle)


def test_a_file_that_is_neither_kind_compare_takes(tmp_path: Path) -> None:
    """A Parquet file without loadgen metadata (another tool's table) or a text file given to
    ``--compare``: one line naming both kinds it takes (was: "not a trace", as if only a
    trace were meant)."""
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "other.parquet")
    (tmp_path / "notes.txt").write_text("hello")
    for name in ("other.parquet", "notes.txt"):
        code, _, err = _whatif(tmp_path, "--compare", str(tmp_path / name))
        assert code == 2, err
        one_error(err, name, "neither a trace")
        assert "loadgen result" in err
